"""Which top-level parameters ``/v1/responses`` and ``/v1/chat/completions`` know.

A parameter nobody knows is a typo or a feature this server does not have: silently
ignoring it hides that from the client, so it is refused (400 ``unknown_parameter``
naming it). The allow-lists are the keys of the installed ``openai`` package's own
request types (``ResponseCreateParams``, ``CompletionCreateParams``), so every parameter
the official client can send is known and the lists move with the package; the few
additions are named below with their reason. Known parameters this server cannot honour
are refused by the checks of each endpoint (``chat_params``, ``response_params``,
``responses_wire``), with a message saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from gateway.http.middleware import ApiError

__all__ = ["chat_params", "check_chat_params", "refuse_unknown", "responses_params"]

# Beside the openai package's keys: ``stream`` (its streaming/non-streaming variants hold
# it), and the penalties the Open Responses specification adds to the Responses request.
_RESPONSES_EXTRA = frozenset({"stream", "presence_penalty", "frequency_penalty"})
_CHAT_EXTRA = frozenset({"stream"})
# Known chat parameters asking for output this server never produces (set to anything
# but null): refused rather than answered without it.
_CHAT_UNSUPPORTED = ("audio", "prediction", "web_search_options")


def _keys(*types: Any) -> frozenset[str]:
    keys: set[str] = set()
    for typed_dict in types:
        keys |= set(typed_dict.__required_keys__) | set(typed_dict.__optional_keys__)
    return frozenset(keys)


@cache
def responses_params() -> frozenset[str]:
    """The top-level parameters a ``POST /v1/responses`` body may have."""
    from openai.types.responses import response_create_params as params

    return (
        _keys(params.ResponseCreateParamsStreaming, params.ResponseCreateParamsNonStreaming)
        | _RESPONSES_EXTRA
    )


@cache
def chat_params() -> frozenset[str]:
    """The top-level parameters a ``POST /v1/chat/completions`` body may have."""
    from openai.types.chat import completion_create_params as params

    return (
        _keys(params.CompletionCreateParamsStreaming, params.CompletionCreateParamsNonStreaming)
        | _CHAT_EXTRA
    )


def _unsupported(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="unsupported_parameter")


def check_chat_params(body: object) -> None:
    """A chat body's top-level parameters: each known (``refuse_unknown``), none asking
    for what the server cannot give (audio, predicted outputs, web search, log
    probabilities). The values of the others are checked by ``chat_params``."""
    refuse_unknown(body, chat_params())
    # A parsed body is a dict: asked first, that costs no ABC check.
    if not isinstance(body, dict | Mapping):
        return
    for param in _CHAT_UNSUPPORTED:
        if body.get(param) is not None:
            raise _unsupported(param, f"'{param}' is not supported by this server")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise _unsupported("modalities", "only text output is supported: 'modalities': ['text']")
    if body.get("logprobs") is True or body.get("top_logprobs"):
        param = "logprobs" if body.get("logprobs") is True else "top_logprobs"
        raise _unsupported(param, "log probabilities are not supported by this server")


def refuse_unknown(body: object, known: frozenset[str]) -> None:
    """400 ``unknown_parameter`` for the first top-level key of ``body`` not in ``known``."""
    if not isinstance(body, dict | Mapping):
        return  # the endpoint's own parser says what is wrong with it
    for key in body:
        if key not in known:
            shown = key if isinstance(key, str) and len(key) <= 64 else f"{str(key)[:64]}..."
            raise ApiError(
                400,
                f"Unknown parameter: '{shown}'.",
                param=shown,
                code="unknown_parameter",
            )
