"""Shared HTTP plumbing under every HTTP surface (API server, web UI, webhooks): the
connection guard, the error middleware and reading request bodies."""
