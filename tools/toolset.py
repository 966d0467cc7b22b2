"""The default toolset of a conversation: which tools an agent gets, built from settings.

It lives here, not in ``agent/``, because it picks concrete tools (``tools.delegate_tool``,
``tools.shell_tool``) while ``agent/`` is the floor those tools stand on.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.providers import ModelProvider
from agent.tools import ToolRegistry
from delivery.inbound import Inbox
from tools.delegate_tool import DelegationLimits, make_delegate_tool
from tools.mcp.manager import mcp_clients
from tools.schedule_tool import make_schedule_tool
from tools.shell_tool import make_shell_tool
from tools.wake_when_tool import make_wake_when_tool
from tools.wakeup_tool import MIN_DELAY_SECONDS, make_wakeup_tool
from tools.watch_tool import make_watch_tool


def build_default_registry(
    provider: ModelProvider,
    *,
    shell_enabled: bool,
    workdir: str | None = None,
    shell_timeout_seconds: float = 60,
    max_async_children: int = 3,
    delegation: DelegationLimits | None = None,
    shell_requires_approval: bool = False,
    wakeup_min_delay_seconds: float = MIN_DELAY_SECONDS,
    inbox: Callable[[], Inbox | None] | None = None,
) -> ToolRegistry:
    """The tools a conversation gets: `delegate_task`, `terminal` (which refuses when off),
    `schedule_wakeup`, `schedule`, `watch`, `wake_when` when given an ``inbox`` (the server
    has hooks), and the tools of the MCP servers this process connects
    (``tools.mcp.manager``), kept current as their lists change.

    Sub-agents get these tools too (those their dispatch names; by default all but
    `delegate_task` and the timers), within the ``delegation`` limits.
    """
    registry = ToolRegistry()
    registry.register(
        make_delegate_tool(
            provider,
            max_async_children=max_async_children,
            limits=delegation,
            parent_tools=lambda: registry,
        )
    )
    registry.register(
        make_shell_tool(
            enabled=shell_enabled,
            workdir=workdir,
            timeout_seconds=shell_timeout_seconds,
            require_approval=shell_requires_approval,
        )
    )
    registry.register(make_wakeup_tool(min_delay_seconds=wakeup_min_delay_seconds))
    registry.register(make_schedule_tool(min_delay_seconds=wakeup_min_delay_seconds))
    registry.register(
        make_watch_tool(shell_enabled=shell_enabled, require_approval=shell_requires_approval)
    )
    if inbox is not None:  # the server declares hooks ([hooks.NAME])
        registry.register(make_wake_when_tool(inbox))
    mcp_clients.attach(registry)
    return registry
