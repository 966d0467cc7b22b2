"""The agent loop, its tool registry and the model providers it runs on."""

from __future__ import annotations

from agent.loop import Agent, AgentResult, run_subagent_sync
from agent.providers import ModelProvider, ModelReply, ProviderError, build_provider
from agent.tools import Tool, ToolContext, ToolRegistry

__all__ = [
    "Agent",
    "AgentResult",
    "ModelProvider",
    "ModelReply",
    "ProviderError",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "build_default_registry",
    "build_provider",
    "run_subagent_sync",
]


def build_default_registry(
    provider: ModelProvider,
    *,
    shell_enabled: bool,
    workdir: str | None = None,
    shell_timeout_seconds: float = 60,
    max_async_children: int = 3,
) -> ToolRegistry:
    """The tools a conversation gets: `delegate_task`, and `terminal` (which refuses when off)."""
    # Imported here: the tools modules import agent.*, so a top-level import would be circular.
    from tools.delegate_tool import make_delegate_tool
    from tools.shell_tool import make_shell_tool

    registry = ToolRegistry()
    registry.register(make_delegate_tool(provider, max_async_children=max_async_children))
    registry.register(
        make_shell_tool(
            enabled=shell_enabled, workdir=workdir, timeout_seconds=shell_timeout_seconds
        )
    )
    return registry
