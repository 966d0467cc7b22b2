"""A server of the DST soak (test_dst_soak.py), on a virtual clock the test passes in.

Usage: soak_worker.py LEDGER_PATH

It reads commands on stdin, one a line:

    step <t>    the virtual time is now t: fire the schedules whose occurrence has come
                (``ScheduleEngine.advance_due``), then offer, claim and acknowledge what is
                due, as a server's re-offer pass and a consumer do; answers DONE
    quit        exit

Each acknowledged occurrence is reported as ``ACK <id>`` with one os.write() after the
acknowledgement returned, so a line read happened, and none is lost when it is SIGKILLed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import storage
from delivery.ledger import Ledger
from delivery.schedules_engine import ScheduleEngine


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> None:
    location = storage.sqlite_files(ledger=Path(sys.argv[1]))
    now = [0.0]
    ledger = Ledger(location.open_ledger(), clock=lambda: now[0], monotonic=lambda: now[0])
    engine = ScheduleEngine(ledger, location.open_schedules())
    say("READY")
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        now[0] = float(words[1])
        engine.advance_due()
        for event in ledger.take_due():
            row_id = event["delivery_id"]
            token = ledger.claim(row_id, "soak")
            if token and ledger.complete(row_id, token):
                say(f"ACK {row_id}")
        say("DONE")


if __name__ == "__main__":
    main()
