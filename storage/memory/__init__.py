"""In-memory stores with the SQL stores' semantics and nothing on disk: for tests, and for
embedding where nothing must outlive the process."""
