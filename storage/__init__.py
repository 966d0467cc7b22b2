"""Where Reveille's state lives: one subpackage per storage dialect, and the one opener.

``sqlite/`` (the default: files under the state directory), ``postgres/`` (several processes
or hosts on one database) and ``memory/`` (tests, embedding) each hold every table: the
ledger (``ledger.py``), the session store (``sessions.py``) and the rest, and a
``dialect.py``: the one object (``storage.dialect.Dialect``) the opener asks for everything
about that dialect (its url, placeholder, schema, stores, backup). Pieces the SQL dialects
share are written once beside them (``sql.py``: the placeholder binding, the compare-and-set
UPDATE compiler, the row codec; ``waiters.py``: how a queued operation's outcome reaches its
thread or coroutine).

``storage.opener`` is the only code that names a dialect; callers (the composition root,
the operator commands, tests, benchmarks) open a store through it, by url.
"""

from storage.opener import Storage, open_ledger_file, open_storage, sqlite_files

__all__ = ["Storage", "open_ledger_file", "open_storage", "sqlite_files"]
