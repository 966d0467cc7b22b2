"""The log as operators read it: one JSON object per line with --log-format json, one line
per turn, background unit and delivery at INFO, never the text of a message."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from reveille.log_format import JsonFormatter
from tests.api_server.serve_support import ROOT, Server, chat, wait_until


def test_a_record_as_one_json_line() -> None:
    record = logging.LogRecord("reveille.x", logging.WARNING, __file__, 1, "a %s", ("b",), None)
    line = json.loads(JsonFormatter(worker=2).format(record))
    assert (line["level"], line["logger"], line["message"], line["worker"]) == (
        "WARNING",
        "reveille.x",
        "a b",
        2,
    )
    assert line["time"].endswith("Z")


def test_a_bad_log_format_is_a_clear_error(tmp_path) -> None:
    env = {**os.environ, "REVEILLE_LOG_FORMAT": "xml", "REVEILLE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "reveille.cli", "deliveries", "list"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "REVEILLE_LOG_FORMAT" in done.stderr


def test_serve_logs_turns_background_work_and_deliveries_as_json(tmp_path) -> None:
    server = Server(tmp_path, extra_env={"REVEILLE_LOG_FORMAT": "json"})
    try:
        session, _ = chat(server.port, "in the background: weigh the secret moon")

        def lines() -> list[dict]:
            out = []
            for raw in list(server.lines):
                raw = raw.strip()
                if raw.startswith("{"):
                    out.append(json.loads(raw))
            return out

        def delivered() -> bool:
            return any(m["message"].startswith("delivery deleg_") for m in lines())

        wait_until(delivered)
        messages = [m["message"] for m in lines()]
        assert any(m.startswith("api_server turn in " + session) for m in messages)
        assert any("background delegation deleg_" in m and "started" in m for m in messages)
        assert any(m.startswith("background deleg_") and "finished" in m for m in messages)
        assert not any("secret moon" in m for m in messages)  # never what was said
    finally:
        server.stop()


def test_the_writer_gets_every_record_in_order_after_quiet_spells_and_bursts() -> None:
    """The records' hand-off (``_Records``): a record put while the writer waits wakes it;
    a burst put while it lingers arrives whole and in order; the stop sentinel too."""
    import threading

    from reveille.log_format import _Records

    records = _Records(linger=0.001)
    got: list[int] = []

    def writer() -> None:
        while (record := records.get()) is not None:
            got.append(record.lineno)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()

    def record(n: int) -> logging.LogRecord:
        return logging.LogRecord("reveille.x", logging.INFO, __file__, n, "m", (), None)

    for spell in range(3):
        for _ in range(200):  # until the writer waits: a put must wake it
            if records._waiting:
                break
            threading.Event().wait(0.005)
        for n in range(spell * 100, spell * 100 + 100):
            records.put_nowait(record(n))
    records.put_nowait(None)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert got == list(range(300)) and records.empty()


def test_the_writer_lingers_long_only_while_lines_come_fast() -> None:
    """After a burst the writer lingers long (fewer wake-ups of a busy server); after a
    quiet spell it lingers short again, so a lone line is written promptly."""
    from reveille.log_format import _Records

    records = _Records(linger=0.005, busy_linger=0.05, busy_rate=200.0)
    records._seen_at -= 1.0  # a second since the writer last looked
    for n in range(500):  # 500 lines in that second
        records.put_nowait(logging.LogRecord("x", logging.INFO, __file__, n, "m", (), None))
    assert records._next_linger() == 0.05
    records._seen_at -= 1.0
    records.put_nowait(logging.LogRecord("x", logging.INFO, __file__, 0, "m", (), None))
    assert records._next_linger() == 0.005


def test_a_text_line_is_what_logging_formatter_writes() -> None:
    """The writer's text formatter (one step per line) writes what ``logging.Formatter``
    writes for the same format: plain records, records with an exception or a stack, and
    a worker's format."""
    from reveille.log_format import _TEXT, _WORKER_TEXT, _TextFormatter

    def records() -> list[logging.LogRecord]:
        plain = logging.LogRecord(
            "gateway.turns.service", logging.INFO, "(unknown file)", 0,
            "%s turn in %s stored (%.0f ms, %d messages of context)",
            ("api_server", "api_1", 12.3, 2), None,
        )  # fmt: skip
        try:
            raise ValueError("boom")
        except ValueError:
            failed = logging.LogRecord("x", logging.ERROR, __file__, 3, "fail", (), sys.exc_info())
        stacked = logging.LogRecord("y", logging.WARNING, __file__, 4, "w %d", (1,), None)
        stacked.stack_info = "Stack (most recent call last):\n  here"
        return [plain, failed, stacked]

    for fmt in (_TEXT, _WORKER_TEXT.format(index=1, pid=99)):
        ours, theirs = _TextFormatter(fmt), logging.Formatter(fmt)
        for mine, reference in zip(records(), records(), strict=True):
            reference.created, reference.msecs = mine.created, mine.msecs
            assert ours.format(mine) == theirs.format(reference)
    # Its one step stamps the time every line: a format without it is refused (not asserted,
    # which ``python -O`` would skip).
    with pytest.raises(ValueError, match="must name the time"):
        _TextFormatter("%(levelname)s %(message)s")


def test_the_handlers_still_ask_their_filters() -> None:
    """The hand-off and the writer's stream skip ``Handler.handle``'s steps only while they
    have no filters: a filter added to either still decides."""
    import io

    from reveille.log_format import _HandOff, _Lines, _Records, _TextFormatter

    records = _Records()
    handoff = _HandOff(records)

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("x", logging.INFO, __file__, 1, msg, (), None)

    assert handoff.handle(record("kept"))
    handoff.addFilter(lambda r: r.msg != "dropped")
    assert not handoff.handle(record("dropped"))
    assert handoff.handle(record("kept too"))
    assert [r.msg for r in records._items] == ["kept", "kept too"]

    out = io.StringIO()
    lines = _Lines(out)
    lines.setFormatter(_TextFormatter("%(asctime)s %(message)s"))
    lines.handle(record("one"))
    lines.addFilter(lambda r: r.msg != "two")
    lines.handle(record("two"))
    lines.handle(record("three"))
    assert [ln.split(" ", 2)[-1] for ln in out.getvalue().splitlines()] == ["one", "three"]
