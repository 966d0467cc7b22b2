"""How an output watch reads its process's output file, pass by pass (``WatchManager._scan``
over a real file): only what was appended since the last pass, at most ``READ_PER_PASS`` while
the process runs (the next pass then comes at once), all the rest in one pass once it ended."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tools import watches
from tools.watch_rules import WatchOrigin, WatchState, compile_guarded, parse_watch
from tools.watches import WatchManager, _Runner

PATTERN = compile_guarded("FAILED")


def _runner() -> _Runner:
    spec = parse_watch(
        {"note": "n", "process_id": "proc_1", "pattern": "FAILED"},
        time.time(),
        min_interval_seconds=1,
    )
    return _Runner("watch_1", spec, WatchOrigin(session_key="s"), WatchState())


def _write(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def test_a_flood_is_read_in_capped_passes_and_only_what_was_appended_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watches, "READ_PER_PASS", 4096)
    out = tmp_path / "output.log"
    _write(out, "".join(f"line {n}\n" for n in range(2000)) + "build FAILED once\n")
    size = out.stat().st_size
    manager, runner = WatchManager(), _runner()
    passes = 0
    while True:
        assert manager._scan(runner, PATTERN, out)
        passes += 1
        assert runner.offset is not None and runner.offset <= passes * 4096
        if not runner.behind:
            break
    assert passes == -(-size // 4096) and runner.offset == size
    assert runner.matched == ["build FAILED once"]
    runner.matched.clear()
    assert manager._scan(runner, PATTERN, out) and runner.matched == []  # nothing new
    _write(out, "build FAILED twice\n")
    assert manager._scan(runner, PATTERN, out)
    assert runner.matched == ["build FAILED twice"] and not runner.behind


def test_the_output_of_an_ended_process_is_read_to_its_end_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watches, "READ_PER_PASS", 4096)
    out = tmp_path / "output.log"
    _write(out, "x" * 50_000 + "\nit FAILED at the end, no newline")
    manager, runner = WatchManager(), _runner()
    runner.offset, runner.process_gone = 0, True  # its files go once this pass is done
    assert manager._scan(runner, PATTERN, out)
    assert runner.offset == out.stat().st_size and not runner.behind
    assert runner.matched == ["it FAILED at the end, no newline"]
