"""The generation parameters of a chat-completions body, checked where the request arrives.

Each parameter the server supports is checked for type and range and becomes a field of
``agent.providers.base.ModelOptions``, which travels with the turn to the provider; a bad
value is a 400 in OpenAI's error shape naming the ``param``. What the server cannot do is
refused the same way, never silently dropped:

* ``n`` other than 1 (one answer per turn);
* a ``response_format`` of a type other than ``text``, ``json_object``, ``json_schema``.

Client-defined ``tools`` and a ``tool_choice`` that names one (or lists ``allowed_tools``)
are read by ``gateway.openai.client_tools``, which knows the server's tool names.
Parameters outside this list (``user``, ``metadata``, penalties, ...) are not checked here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agent.messages import JSONObject
from agent.providers.base import UNSET_OPTIONS, ModelOptions
from gateway.http.middleware import ApiError

__all__ = ["MAX_STOP_SEQUENCES", "model_options", "refuse_unsupported"]

MAX_STOP_SEQUENCES = 4
_TOOL_CHOICES = ("none", "auto", "required")
_RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def _invalid(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _number(body: Mapping[str, object], param: str, low: float, high: float) -> float | None:
    value = body.get(param)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _invalid(param, f"'{param}' must be a number", "invalid_type")
    if not low <= value <= high:
        raise _invalid(param, f"'{param}' must be between {low:g} and {high:g}, got {value!r}")
    return float(value)


def _integer(body: Mapping[str, object], param: str, low: int | None = None) -> int | None:
    value = body.get(param)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(param, f"'{param}' must be an integer", "invalid_type")
    if low is not None and value < low:
        raise _invalid(param, f"'{param}' must be at least {low}, got {value}")
    return value


def _stop(body: Mapping[str, object]) -> str | tuple[str, ...] | None:
    value = body.get("stop")
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _invalid("stop", "'stop' must be a string or an array of strings", "invalid_type")
    sequences = tuple(item for item in value if isinstance(item, str))
    if len(sequences) != len(value):
        raise _invalid("stop", "'stop' must be a string or an array of strings", "invalid_type")
    if len(value) > MAX_STOP_SEQUENCES:
        raise _invalid(
            "stop", f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences, got {len(value)}"
        )
    return sequences


def _response_format(body: Mapping[str, object]) -> JSONObject | None:
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid("response_format", "'response_format' must be an object", "invalid_type")
    kind = value.get("type")
    if kind not in _RESPONSE_FORMATS:
        raise _invalid(
            "response_format",
            f"'response_format.type' must be one of {', '.join(_RESPONSE_FORMATS)}, got {kind!r}",
        )
    if kind == "json_schema":
        schema = value.get("json_schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
            raise _invalid(
                "response_format",
                "'response_format.json_schema' must be an object with a 'name' (and a 'schema')",
            )
    return value


def _tool_choice(body: Mapping[str, object]) -> str | JSONObject | None:
    value = body.get("tool_choice")
    if value is None:
        return None
    if isinstance(value, str) and value in _TOOL_CHOICES:
        return value
    if isinstance(value, dict):
        return value  # a tool by name, or allowed_tools: checked by ``client_tools``
    raise _invalid("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or an object")


def _parallel_tool_calls(body: Mapping[str, object]) -> bool | None:
    value = body.get("parallel_tool_calls")
    if value is None or isinstance(value, bool):
        return value
    raise _invalid("parallel_tool_calls", "'parallel_tool_calls' must be a boolean", "invalid_type")


def refuse_unsupported(body: Mapping[str, object]) -> None:
    """400 for what the server cannot do: ``n`` other than 1."""
    n = _integer(body, "n")
    if n is not None and n != 1:
        raise _invalid("n", f"only n=1 is supported, got n={n}", "unsupported_value")


# Every parameter ``model_options`` reads. Most bodies carry none of them: their options
# are the unset ones, without a check per parameter.
_PARAMS = frozenset(
    (
        "n",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "response_format",
        "tool_choice",
        "parallel_tool_calls",
    )
)


def model_options(body: Mapping[str, object]) -> ModelOptions:
    """The generation options of ``body``, each checked (see the module docstring)."""
    if _PARAMS.isdisjoint(body):
        return UNSET_OPTIONS  # one instance serves every body that sets nothing
    refuse_unsupported(body)
    return ModelOptions(
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        max_tokens=_integer(body, "max_tokens", 1),
        max_completion_tokens=_integer(body, "max_completion_tokens", 1),
        stop=_stop(body),
        seed=_integer(body, "seed"),
        response_format=_response_format(body),
        tool_choice=_tool_choice(body),
        parallel_tool_calls=_parallel_tool_calls(body),
    )
