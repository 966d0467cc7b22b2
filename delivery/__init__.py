"""The durable delivery ledger: one row per unit of background work and its completion."""
