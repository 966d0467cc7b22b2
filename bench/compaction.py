"""What a long conversation sends the model, with and without compaction.

Runs ``--turns`` turns of one API-server session through the real turn service over a
SQLite session store, with an in-process model that answers at once and counts what each
call was sent (characters of context), once with compaction off (the 400 000-character
bound only) and once with ``--window`` tokens; a background result arrives every 10 turns.
Prints, per run: the characters sent by the last call and in all, the compactions, the
rows read by the last turn, and the wall time per turn.

Usage: python bench/compaction.py [--turns 1000] [--window 32000] [--message-chars 1200]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import storage
from agent.loop import Agent
from agent.markers import SUMMARISE_MARKER
from agent.messages import ChatMessage, ToolSchema
from agent.providers.base import ModelOptions, ModelReply
from agent.tools import ToolRegistry
from gateway.config import Platform
from gateway.session import SessionSource, SessionStore
from gateway.turns.compaction import CompactionPolicy, Compactor, provider_summariser
from gateway.turns.service import StartedTurn, TurnRequest, TurnService, agent_turn_runner

SID = "api_bench"


class CountingModel:
    name = "bench"

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.summaries = 0

    async def complete(
        self,
        messages: list[ChatMessage],
        *,
        tools: list[ToolSchema] | None = None,
        on_delta: Callable[[str], Awaitable[None]] | None = None,
        options: ModelOptions | None = None,
    ) -> ModelReply:
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        if any(SUMMARISE_MARKER in str(m.get("content")) for m in messages):
            self.summaries += 1
            return ModelReply("The user and the assistant discussed many things. " * 10)
        self.sent.append(chars)
        return ModelReply("ok, noted: " + "reply text " * 30)


async def run(turns: int, window: int, message_chars: int, directory: Path) -> dict[str, Any]:
    store = SessionStore(storage.sqlite_files(sessions=directory / "s.db").open_sessions())
    await store.acreate_session(SID, source=SessionSource(Platform.API_SERVER, chat_id=SID))
    model = CountingModel()
    compactor = (
        Compactor(store, provider_summariser(model), CompactionPolicy(context_window=window))
        if window
        else None
    )
    service = TurnService(
        store,
        agent_turn_runner(Agent(model, ToolRegistry())),
        render=lambda r: {"content": str(r.content)},
        compactor=compactor,
    )
    started_at = time.perf_counter()
    for n in range(turns):
        if n % 10 == 0:
            store.append_message(
                SID,
                "system",
                f"result {n}: " + "found " * 60,
                display_kind="async_delegation_complete",
                display_metadata={"kind": "delegation", "delegation_id": f"deleg_{n}"},
                dedupe_key=f"deleg:{n}",
            )
        text = f"message {n} " + "x" * message_chars
        started = await service.start(TurnRequest(SID, [{"role": "user", "content": text}]))
        assert isinstance(started, StartedTurn)
        await started.task
    elapsed = time.perf_counter() - started_at
    live = len((await store.abegin_turn(SID)).history)
    store.close()
    return {
        "last_call_chars": model.sent[-1],
        "total_chars": sum(model.sent),
        "compactions": compactor.compactions if compactor else 0,
        "rows_read_by_a_turn": live,
        "ms_per_turn": elapsed / turns * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--window", type=int, default=32000)
    parser.add_argument("--message-chars", type=int, default=1200)
    args = parser.parse_args()
    for window in (0, args.window):
        with tempfile.TemporaryDirectory() as tmp:
            out = asyncio.run(run(args.turns, window, args.message_chars, Path(tmp)))
        label = f"context_window={window}" if window else "no compaction (400k-char bound)"
        print(
            f"{label:34s} last call {out['last_call_chars']:>8,} chars, all calls "
            f"{out['total_chars']:>12,} chars, {out['compactions']:>4} compactions, "
            f"{out['rows_read_by_a_turn']:>5} rows read per turn, "
            f"{out['ms_per_turn']:.2f} ms/turn"
        )


if __name__ == "__main__":
    main()
