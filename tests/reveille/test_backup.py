"""`reveille backup` / `reveille restore`: a copy taken while work is pending restores into a
fresh state directory, private, and a server started there delivers every pending result
once; bad targets and foreign copies are refused with nothing written."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.markers import read_wake_data
from gateway.config import Platform
from gateway.session import SessionSource
from reveille.backup import BackupError, backup, restore
from tests.sessions._support import make_session
from tests.stores import session_file_store
from tests.webui.test_two_processes import ROOT, Serve, _pending_completions, wait_delivered


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REVEILLE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("REVEILLE_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_backup_taken_mid_work_restores_and_delivers_each_result_once(tmp_path: Path) -> None:
    home, copy, fresh = tmp_path / "home", tmp_path / "backup", tmp_path / "restored"
    sid = "webui-backup"
    with session_file_store(home / "sessions.db") as store:
        make_session(store, sid, source=SessionSource(platform=Platform.WEBUI, chat_id=sid))
    ids = _pending_completions(home, sid, 3)  # finished, not delivered: nothing serves yet

    made = _cli(home, "backup", str(copy))
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(copy.stat().st_mode) == 0o700
    for name in ("ledger.db", "sessions.db"):
        assert stat.S_IMODE((copy / name).stat().st_mode) == 0o600

    restored = _cli(fresh, "restore", str(copy))
    assert restored.returncode == 0, restored.stderr
    assert "every store opens" in restored.stdout

    server = Serve(fresh)
    try:
        server.wait_listening()
        wait_delivered(fresh, ids)
    finally:
        assert server.stop() == 0, "".join(server.lines)
    with session_file_store(fresh / "sessions.db") as store:
        woken = [  # a combined wake-up carries one data line per result
            meta["delegation_id"]
            for m in store.messages(sid)
            if m.role == "user" and (m.display_metadata or {}).get("wake")
            for meta in read_wake_data(m.content)
        ]
    assert sorted(woken) == sorted(ids)  # each once


def test_backup_and_restore_refuse_what_they_must(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with session_file_store(home / "sessions.db") as store:
        make_session(store, "s1")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "something").write_text("x")
    with pytest.raises(BackupError, match="not an empty directory"):
        backup(home, taken)
    with pytest.raises(BackupError, match="does not exist"):
        backup(tmp_path / "nowhere", tmp_path / "b")
    with pytest.raises(BackupError, match="holds no Reveille store"):
        restore(taken, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()
    assert backup(home, tmp_path / "b") == ["sessions.db"]
    with pytest.raises(BackupError, match="not an empty directory"):
        restore(tmp_path / "b", home)  # never over a live state directory
