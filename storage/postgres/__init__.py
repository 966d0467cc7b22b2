"""The PostgreSQL store: ledger, sessions and idempotency records in one database shared by
every server, its schema under versioned migrations, wake-ups over LISTEN/NOTIFY."""
