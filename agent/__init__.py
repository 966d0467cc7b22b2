"""The agent loop, its tool registry and the model providers it runs on.

The concrete tools and the default toolset (``build_default_registry``) live one floor up,
in ``tools/`` (``tools.toolset``): this package does not import them.
"""

from __future__ import annotations

from agent.loop import Agent, AgentResult
from agent.providers import ModelProvider, ModelReply, ProviderError, build_provider
from agent.subagent import run_subagent_sync
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
    "build_provider",
    "run_subagent_sync",
]
