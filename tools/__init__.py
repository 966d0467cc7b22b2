"""Agent tools and the core contract modules (async delegation, process registry)."""
