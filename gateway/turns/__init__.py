"""The turn service: one turn of a session (transcript, folding of background results,
the agent, idempotency, approvals gate, compaction), shared by every surface."""
