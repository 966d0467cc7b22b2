"""The Response fields a ``POST /v1/responses`` body sets only to have them echoed back,
and the known parameters it may not set.

OpenAI's Response object repeats what the request asked (``presence_penalty``,
``reasoning``, ``service_tier``, ``truncation``, a stored ``prompt`` reference...), and
clients and the Open Responses schema expect every one of them present with its type.
``echoed_params`` checks each (400 in OpenAI's error shape naming the ``param``) and
returns them with the documented defaults for those not given; ``responses_wire`` stores
them on the request and ``body_of`` echoes them. None of them changes what the model is
asked: README's OpenAI section says, field by field, what each one does here.
``refuse_unsupported`` refuses (400) the known parameters asking for what this server does
not have (``context_management``, ``moderation``...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from agent.messages import JSONObject, JSONValue
from gateway.http.middleware import ApiError

__all__ = ["Echoed", "echoed_params", "refuse_unsupported"]

_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_SUMMARIES = ("auto", "concise", "detailed")
_TIERS = ("auto", "default", "flex", "scale", "priority")
_TRUNCATIONS = ("auto", "disabled")
_MAX_ID_TEXT = 512
# Known parameters (the openai package's) asking for what this server does not have.
_UNSUPPORTED = (
    "access_programs",
    "background_options",
    "context_management",
    "image",
    "moderation",
    "prompt_cache_options",
)


@dataclass(frozen=True)
class Echoed:
    """The echo-only fields of a request, checked, with their defaults."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    reasoning: JSONObject | None = None
    max_tool_calls: int | None = None
    service_tier: str = "default"
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    truncation: str = "disabled"
    prompt: JSONObject | None = None
    user: str | None = None


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _penalty(body: Mapping[str, object], param: str) -> float:
    value = body.get(param)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(param, f"'{param}' must be a number", "invalid_type")
    if not -2.0 <= value <= 2.0:
        raise _bad(param, f"'{param}' must be between -2 and 2, got {value!r}")
    return float(value)


def _top_logprobs(body: Mapping[str, object]) -> int:
    value = body.get("top_logprobs")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 20:
        raise _bad("top_logprobs", "'top_logprobs' must be an integer from 0 to 20")
    if value:
        raise _bad(
            "top_logprobs",
            "'top_logprobs' above 0 is not supported: this server does not return log "
            "probabilities",
            "unsupported_value",
        )
    return 0


def _choice(body: Mapping[str, object], param: str, allowed: tuple[str, ...], default: str) -> str:
    value = body.get(param)
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise _bad(param, f"'{param}' must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _short_text(body: Mapping[str, object], param: str) -> str | None:
    value = body.get(param)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > _MAX_ID_TEXT:
        raise _bad(param, f"'{param}' must be a string of at most {_MAX_ID_TEXT} characters")
    return value


def _reasoning(body: Mapping[str, object]) -> JSONObject | None:
    value = body.get("reasoning")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("reasoning", "'reasoning' must be an object", "invalid_type")
    effort = value.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise _bad("reasoning.effort", f"'reasoning.effort' must be one of {', '.join(_EFFORTS)}")
    # ``generate_summary`` is the deprecated name of ``summary``.
    summary = value.get("summary", value.get("generate_summary"))
    if summary is not None and summary not in _SUMMARIES:
        raise _bad(
            "reasoning.summary", f"'reasoning.summary' must be one of {', '.join(_SUMMARIES)}"
        )
    return {"effort": effort, "summary": summary}


def _max_tool_calls(body: Mapping[str, object]) -> int | None:
    value = body.get("max_tool_calls")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad("max_tool_calls", "'max_tool_calls' must be an integer of at least 1")
    return value


def _prompt(body: Mapping[str, object]) -> JSONObject | None:
    """A stored prompt reference ``{id, version?, variables?}``: checked and echoed."""
    value = body.get("prompt")
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("id"), str) or not value["id"]:
        raise _bad("prompt", "'prompt' must be an object with a string 'id'", "invalid_type")
    version = value.get("version")
    if version is not None and not isinstance(version, str):
        raise _bad("prompt.version", "'prompt.version' must be a string", "invalid_type")
    variables = value.get("variables")
    if variables is not None and not isinstance(variables, dict):
        raise _bad("prompt.variables", "'prompt.variables' must be an object", "invalid_type")
    echoed: JSONObject = {"id": value["id"], "version": version}
    if variables is not None:
        kept: dict[str, JSONValue] = dict(variables)
        echoed["variables"] = kept
    return echoed


def echoed_params(body: Mapping[str, object]) -> Echoed:
    """The echo-only fields of ``body``, each checked (see the module docstring)."""
    return Echoed(
        presence_penalty=_penalty(body, "presence_penalty"),
        frequency_penalty=_penalty(body, "frequency_penalty"),
        top_logprobs=_top_logprobs(body),
        reasoning=_reasoning(body),
        max_tool_calls=_max_tool_calls(body),
        service_tier=_choice(body, "service_tier", _TIERS, "default"),
        safety_identifier=_short_text(body, "safety_identifier"),
        prompt_cache_key=_short_text(body, "prompt_cache_key"),
        truncation=_choice(body, "truncation", _TRUNCATIONS, "disabled"),
        prompt=_prompt(body),
        user=_short_text(body, "user"),
    )


def refuse_unsupported(body: Mapping[str, object]) -> None:
    """400 for known parameters this server cannot honour (set to anything but null)."""
    for name in _UNSUPPORTED:
        if body.get(name) is not None:
            raise _bad(name, f"'{name}' is not supported by this server", "unsupported_parameter")
    include = body.get("include")
    if include is not None and (
        not isinstance(include, list) or not all(isinstance(i, str) for i in include)
    ):
        raise _bad("include", "'include' must be an array of strings", "invalid_type")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _bad("stream_options", "'stream_options' must be an object", "invalid_type")
