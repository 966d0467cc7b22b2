"""`reveille approvals`: list, approve and deny, run as an operator would (a real subprocess),
against the session store a turn of this process waits in."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.tools import ApprovalExpired
from delivery.session_backend import ApprovalRecord
from gateway.approvals import Approvals
from gateway.session import SessionSource
from gateway.turns.hold import TurnHold
from tests.sessions._support import make_session
from tests.stores import session_file_store


def reveille(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REVEILLE_HOME": str(home)}
    env.pop("REVEILLE_DATABASE_URL", None)
    env.pop("REVEILLE_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


async def areveille(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(reveille, home, *args)


async def test_an_operator_decides_what_a_turn_waits_for(tmp_path: Path) -> None:
    store = session_file_store(tmp_path / "sessions.db")
    try:
        make_session(store, "sess_cli", source=SessionSource(platform="api_server", chat_id="x"))
        hold = TurnHold(store, "sess_cli")  # renewed while the turn waits, as a server does
        assert await hold.take()
        approvals = Approvals(store, poll_seconds=0.05)
        # A command whose text tries to forge a line of the listing.
        command = "echo hi\nappr_fake  api_server  sess_other"
        waiting = asyncio.create_task(approvals.confirm_for("sess_cli")(command))
        while not (await approvals.pending()):
            await asyncio.sleep(0.02)
        [pending] = await approvals.pending()

        listed = await areveille(tmp_path, "approvals", "list")
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].startswith(f"{pending.id}  api_server  sess_cli")
        assert lines[1].strip() == repr(command)
        assert len(lines) == 2
        as_json = await areveille(tmp_path, "approvals", "list", "--json")
        assert [json.loads(x)["id"] for x in as_json.stdout.splitlines()] == [pending.id]

        approved = await areveille(tmp_path, "approvals", "approve", pending.id)
        assert approved.returncode == 0, approved.stderr
        assert await asyncio.wait_for(waiting, 30) is True
        again = await areveille(tmp_path, "approvals", "deny", pending.id)
        assert again.returncode == 1 and "already decided (approved)" in again.stderr
        unknown = await areveille(tmp_path, "approvals", "approve", "appr_forged")
        assert unknown.returncode == 1 and "no approval" in unknown.stderr
        assert (await areveille(tmp_path, "approvals", "list")).stdout.strip() == (
            "no approvals are pending"
        )
        await hold.release()
    finally:
        store.close()


def test_an_approval_whose_turn_is_gone_expires(tmp_path: Path) -> None:
    """A turn whose server died (its lease lapsed) can never be answered: deciding its
    approval settles it as denied, says so, and it is never listed as pending."""
    store = session_file_store(tmp_path / "sessions.db")
    try:
        make_session(store, "sess_dead", source=SessionSource(platform="api_server", chat_id="x"))
        store.take_turn("sess_dead", "turn_dead", ttl_seconds=0.3)
        record = ApprovalRecord(
            "appr_dead000001", "sess_dead", "turn_dead", "ls", "pending", time.time()
        )
        assert store.ask_approval(record)
        while store.running_turns():  # the lease lapses (its holder stopped renewing it)
            time.sleep(0.05)
        assert "no approvals are pending" in reveille(tmp_path, "approvals", "list").stdout
        approved = reveille(tmp_path, "approvals", "approve", record.id)
        assert approved.returncode == 1 and "expired" in approved.stderr
        decided = store.get_approval(record.id)
        assert decided is not None and decided.status == "denied"
    finally:
        store.close()


async def test_an_operator_decides_what_a_background_unit_waits_for(tmp_path: Path) -> None:
    """A background unit's approval holds no session: listed with its unit and deadline,
    denied from the CLI (the unit is told so), and one past its deadline reported expired."""
    store = session_file_store(tmp_path / "sessions.db")
    try:
        make_session(store, "sess_bg", source=SessionSource(platform="api_server", chat_id="x"))
        approvals = Approvals(store, poll_seconds=0.05)
        waiting = asyncio.create_task(approvals.confirm_unit_for("sess_bg")("deleg_cli1", "ls"))
        while not (await approvals.pending()):
            await asyncio.sleep(0.02)
        [pending] = await approvals.pending()
        assert store.running_turns() == {}  # nothing holds the session

        listed = await areveille(tmp_path, "approvals", "list")
        lines = listed.stdout.splitlines()
        assert lines[0].startswith(f"{pending.id}  api_server  sess_bg")
        assert lines[1].strip().startswith("background task deleg_cli1, expires in ")
        (row,) = [
            json.loads(x)
            for x in (await areveille(tmp_path, "approvals", "list", "--json")).stdout.splitlines()
        ]
        assert row["unit_id"] == "deleg_cli1" and row["expires_at"] > time.time()
        denied = await areveille(tmp_path, "approvals", "deny", pending.id)
        assert denied.returncode == 0 and "background task deleg_cli1" in denied.stdout
        assert await asyncio.wait_for(waiting, 30) is False

        late = Approvals(store, poll_seconds=60, timeout_seconds=0.2)
        asked = asyncio.create_task(late.confirm_unit_for("sess_bg")("deleg_cli2", "ls -l"))
        while not store.pending_unit_approvals():
            await asyncio.sleep(0.02)
        (record,) = store.pending_unit_approvals()
        with pytest.raises(ApprovalExpired):  # the unit's own deadline: told "expired"
            await asyncio.wait_for(asked, 30)
        approved = await areveille(tmp_path, "approvals", "approve", record.id)
        assert approved.returncode == 1 and "expired: nobody answered" in approved.stderr
        assert store.get_approval(record.id).status == "expired"
    finally:
        store.close()
