"""The embedded SQLite store: the ledger and the session store, each in its own WAL file
under the state directory, written by one group-commit writer thread per file."""
