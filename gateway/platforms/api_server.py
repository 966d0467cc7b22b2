"""Contract path kept for plugins: the API server lives in ``gateway.surfaces.api_server``."""

from gateway.surfaces.api_server.adapter import (
    DEFAULT_KEEPALIVE_SECONDS,
    SESSION_HEADER,
    ApiServerAdapter,
    TurnRunner,
    agent_turn_runner,
    derive_session_id,
)

__all__ = [
    "DEFAULT_KEEPALIVE_SECONDS",
    "SESSION_HEADER",
    "ApiServerAdapter",
    "TurnRunner",
    "agent_turn_runner",
    "derive_session_id",
]
