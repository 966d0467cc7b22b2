"""The `terminal` tool: runs a shell command, in the foreground or as a background process.

It is off unless the operator enables it, and when off it runs nothing and says how to turn
it on. Every surface's turns set ``ToolContext.confirm`` when a person approves each
command (``[shell] approvals = "always"``, the default): the command runs only when it
answers True. With ``require_approval`` a call that comes without a way to ask (a context
some caller built without the hook) is refused, never run unasked. Background processes
go through `tools.process_registry`, which can notify the originating session when they exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal

from agent.messages import JSONObject
from agent.tool_args import as_bool
from agent.tools import ApprovalExpired, Tool, ToolContext

SHELL_DISABLED_ERROR = (
    "the shell tool is disabled; enable it with REVEILLE_SHELL_ENABLED=1 "
    "(or shell.enabled in the settings file)"
)
DENIED_ERROR = "the user denied running this command; it was not run"
# Not a denial: nobody decided before the approval's deadline ([shell] approval_timeout).
EXPIRED_ERROR = (
    "approval expired: nobody answered before the approval timeout; the command was not run "
    "(nobody denied it either)"
)
NO_APPROVAL_ERROR = (
    "this command needs a person's approval and this conversation has no way to ask for "
    "one; it was not run"
)
OUTPUT_TAIL_BYTES = 16 * 1024
_READ_CHUNK = 4096
_DRAIN_SECONDS = 2.0

PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The shell command to run."},
        "background": {
            "type": "boolean",
            "description": "Run as a background process and return its id at once.",
            "default": False,
        },
        "notify_on_complete": {
            "type": "boolean",
            "description": "With background: bring the exit status and output back to "
            "this conversation when the process ends.",
            "default": False,
        },
    },
    "required": ["command"],
}

DESCRIPTION = (
    "Run a shell command. In the foreground it returns the exit code and the last 16 KiB "
    "of output; with background=true it starts a process and returns its id at once, and "
    "notify_on_complete=true reports back here when it exits."
)


class _Tail:
    """The last `limit` bytes of a stream, so chatty commands use bounded memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    async def read_all(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            self.data += chunk
            if len(self.data) > self.limit:
                del self.data[: len(self.data) - self.limit]
                self.truncated = True


def _kill_tree(process: asyncio.subprocess.Process) -> None:
    # The shell's children must die too, or a timed-out pipeline keeps running (and keeps
    # our pipe open); the process was started in its own session, so its group id is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if hasattr(os, "killpg"):
            os.killpg(process.pid, signal.SIGKILL)
        else:  # pragma: no cover - non-POSIX
            process.kill()


async def run_foreground(command: str, *, workdir: str | None, timeout: float) -> JSONObject:
    process = await asyncio.create_subprocess_shell(
        command,
        cwd=workdir,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    tail = _Tail(OUTPUT_TAIL_BYTES)
    reader = asyncio.ensure_future(tail.read_all(process.stdout))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(reader), timeout)
        await asyncio.wait_for(process.wait(), max(0.0, deadline - loop.time()))
    except TimeoutError:
        timed_out = True
        _kill_tree(process)
    except BaseException:
        # Cancelled with the turn (or a stalled sub-agent): the command must not outlive it,
        # and it is reaped here, so its pipes do not outlive the loop that is ending.
        _kill_tree(process)
        reader.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(process.wait(), _DRAIN_SECONDS)
        raise
    await process.wait()
    # A process that escaped the group can still hold the pipe: keep what was read so far.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(reader, _DRAIN_SECONDS)
    result: JSONObject = {
        "exit_code": process.returncode,
        "output": bytes(tail.data).decode("utf-8", errors="replace"),
        "truncated": tail.truncated,
    }
    if timed_out:
        result["timed_out"] = True
        result["error"] = f"the command timed out after {timeout:g} s and was killed"
    return result


def make_shell_tool(
    *,
    enabled: bool,
    workdir: str | None = None,
    timeout_seconds: float = 60,
    require_approval: bool = False,
) -> Tool:
    """The `terminal` tool; with `enabled=False` every call is refused without running anything."""

    async def handler(args: JSONObject, ctx: ToolContext) -> JSONObject:
        if not enabled:
            return {"error": SHELL_DISABLED_ERROR}
        command = str(args.get("command") or "")
        if not command.strip():
            return {"error": "command must not be empty"}
        if ctx.confirm is None and require_approval:
            return {"error": NO_APPROVAL_ERROR, "denied": True}
        try:
            if ctx.confirm is not None and not await ctx.confirm(command):
                return {"error": DENIED_ERROR, "denied": True}
        except ApprovalExpired:
            return {"error": EXPIRED_ERROR, "expired": True}
        if not as_bool(args.get("background")):
            return await run_foreground(command, workdir=workdir, timeout=timeout_seconds)
        await ctx.prepare_background()  # its origin session is written before any result
        # Resolved at call time: the process machinery loads only once a command goes to the
        # background, and a substituted contract module (an embedder's, a test's) is honoured.
        from tools.process_registry import process_registry

        spawned = await asyncio.to_thread(
            process_registry.spawn,
            command,
            cwd=workdir,
            session_key=ctx.session_key,
            origin_session_id=ctx.session_id,
            origin_ui_session_id=ctx.origin_ui_session_id,
            notify_on_complete=as_bool(args.get("notify_on_complete")),
        )
        # Round-trip through JSON so whatever the registry returns is what the model sees.
        return json.loads(json.dumps(spawned, default=str))

    return Tool(name="terminal", description=DESCRIPTION, parameters=PARAMETERS, handler=handler)
