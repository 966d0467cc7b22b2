"""The web UI's backend: its delivery consumer, its routes and its per-process maps."""
