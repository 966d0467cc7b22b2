"""An MCP server's form (``elicitation/create`` with a ``requestedSchema``) as Reveille reads it.

MCP's form schemas are flat: each property is a string (optionally an ``enum``), a number,
an integer or a boolean, with an optional ``default``; ``required`` names the fields an
answer must carry. ``parse_form`` turns one into a typed ``ElicitForm`` (a schema outside
that subset is refused with ``FormError``), ``form.prompt()`` is the text a person is shown
(the approval's text), and ``form.answer(values)`` checks a person's values against the
schema, filling the defaults of the fields left out (SEP-1034: a client applies defaults).

A surface that can only say yes or no (a Telegram keyboard, a web UI card) answers with
``form.yes_answer()``: the schema's defaults (a lone boolean field without one is the yes
itself). A form with a required field and no default cannot be answered that way: it is
declined.

``asking_form(schema)`` marks the confirmation the connection asks next, in this task, as
one that carries a form: the approvals (``gateway.approvals``) record the schema with the
question, so the API (``POST /api/approvals/{id}`` with ``values``) and ``reveille
approvals approve --values`` can answer with values, checked against it when decided; the
``FormQuestion`` then holds the values approved. A confirmation that does not go through
the approvals (or runs on another loop: a sub-agent's) leaves it unanswered, and the
connection falls back to the yes/no answer.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

from agent.messages import JSONObject

FieldKind = Literal["string", "number", "integer", "boolean"]
Value = str | int | float | bool
# What an accepted answer carries (the SDK's ``ElicitResult.content``).
FormContent = dict[str, str | int | float | bool | list[str] | None]
_KINDS: tuple[FieldKind, ...] = ("string", "number", "integer", "boolean")


class FormError(ValueError):
    """A form schema Reveille cannot ask, or an answer the form does not accept; the
    message names the field and why."""


@dataclass(frozen=True)
class FormField:
    """One field of a form."""

    name: str
    kind: FieldKind
    required: bool
    title: str = ""
    options: tuple[str, ...] = ()  # a string field's enum
    default: Value | None = None

    def check(self, value: object) -> Value:
        """``value`` when it fits this field (an integral float for an integer field is
        taken as the integer); FormError otherwise."""
        where = f"field {self.name!r}"
        if self.kind == "boolean":
            if isinstance(value, bool):
                return value
            raise FormError(f"{where} takes true or false")
        if self.kind == "string":
            if not isinstance(value, str):
                raise FormError(f"{where} takes a string")
            if self.options and value not in self.options:
                raise FormError(f"{where} takes one of {', '.join(self.options)}")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FormError(f"{where} takes a number")
        if not math.isfinite(value):
            raise FormError(f"{where} takes a finite number")
        if self.kind == "integer":
            if isinstance(value, float) and not value.is_integer():
                raise FormError(f"{where} takes an integer")
            return int(value)
        return value

    def describe(self) -> str:
        kind = f"one of {'/'.join(self.options)}" if self.options else self.kind
        parts = [f"{self.name} ({kind}{', required' if self.required else ''})"]
        if self.title and self.title != self.name:
            parts.append(f": {self.title}")
        if self.default is not None:
            parts.append(f" [default {json.dumps(self.default, ensure_ascii=False)}]")
        return "".join(parts)


@dataclass(frozen=True)
class ElicitForm:
    """A server's question and the fields it asks for."""

    message: str
    fields: tuple[FormField, ...]

    def prompt(self, server: str) -> str:
        """What a person reads: who asks, the question, and each field."""
        head = f"MCP server {server} asks: {self.message}"
        if not self.fields or self._flag() is not None:
            return head  # a yes/no question: the yes is its answer
        return head + "\n" + "\n".join(f"- {f.describe()}" for f in self.fields)

    def yes_answer(self) -> FormContent | None:
        """The content a plain yes gives: each default; a lone boolean field without a
        default is the yes itself. None when a required field has no default (a yes
        cannot answer it)."""
        flag = self._flag()
        if flag is not None:
            return {flag.name: True if flag.default is None else flag.default}
        content: FormContent = {}
        for field in self.fields:
            if field.default is not None:
                content[field.name] = field.default
            elif field.required:
                return None
        return content

    def _flag(self) -> FormField | None:
        """The form's lone boolean field (a yes/no question), if that is all it asks."""
        if len(self.fields) == 1 and self.fields[0].kind == "boolean":
            return self.fields[0]
        return None

    def answer(self, values: JSONObject) -> FormContent:
        """``values`` checked against the form, with the defaults of fields left out;
        FormError names an unknown field, a value of the wrong kind or a required one
        missing."""
        known = {f.name: f for f in self.fields}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise FormError(f"unknown field(s): {', '.join(unknown)}")
        content: FormContent = {}
        for field in self.fields:
            if field.name in values:
                content[field.name] = field.check(values[field.name])
            elif field.default is not None:
                content[field.name] = field.default
            elif field.required:
                raise FormError(f"field {field.name!r} is required")
        return content


def parse_form(message: str, schema: JSONObject) -> ElicitForm:
    """The form of ``schema`` (a ``requestedSchema``); FormError for one outside MCP's
    flat subset (a nested object, an array, a field without a type Reveille knows)."""
    properties = schema.get("properties") or {}
    if not isinstance(properties, dict):
        raise FormError("properties must be an object")
    required = schema.get("required") or []
    if not isinstance(required, list):
        raise FormError("required must be a list")
    fields = tuple(
        _field(str(name), body, str(name) in required) for name, body in properties.items()
    )
    return ElicitForm(message=message, fields=fields)


def _field(name: str, body: object, required: bool) -> FormField:
    if not isinstance(body, dict):
        raise FormError(f"field {name!r}: expected a schema object")
    kind = body.get("type")
    if kind not in _KINDS:
        raise FormError(f"field {name!r}: type {kind!r} is not a form field's")
    options = body.get("enum") or ()
    if not isinstance(options, list | tuple) or not all(isinstance(o, str) for o in options):
        raise FormError(f"field {name!r}: enum must list strings")
    title = body.get("title") or body.get("description") or ""
    field = FormField(
        name=name,
        kind=kind,
        required=required,
        title=str(title),
        options=tuple(options),
    )
    if "default" not in body or body["default"] is None:
        return field
    # A default the field itself would refuse is left out rather than sent back.
    try:
        default = field.check(body["default"])
    except FormError:
        return field
    return FormField(
        name=name,
        kind=field.kind,
        required=required,
        title=field.title,
        options=field.options,
        default=default,
    )


@dataclass
class FormQuestion:
    """A form asked with a confirmation: its schema (JSON text) and, once a person approved
    it with values, the checked answer."""

    schema: str
    answer: FormContent | None = None


_asking: ContextVar[FormQuestion | None] = ContextVar("reveille_mcp_form", default=None)


@contextlib.contextmanager
def asking_form(schema: JSONObject) -> Iterator[FormQuestion]:
    """While inside, a confirmation asked in this task carries ``schema`` (see the module
    docstring)."""
    question = FormQuestion(json.dumps(schema, ensure_ascii=False, sort_keys=True))
    token = _asking.set(question)
    try:
        yield question
    finally:
        _asking.reset(token)


def form_asked() -> FormQuestion | None:
    """The form the confirmation being asked now carries, if any."""
    return _asking.get()


def decided_answer(schema: str, values: JSONObject | None) -> FormContent | None:
    """What a yes to the form ``schema`` answers: ``values`` checked (FormError says why
    not), or without values the yes/no answer (None: a yes cannot fill it)."""
    form = parse_form("", json.loads(schema))
    return form.yes_answer() if values is None else form.answer(values)
