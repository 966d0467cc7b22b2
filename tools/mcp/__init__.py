"""MCP servers' tools for the agent: configuration (``config``), one long-lived client session
per server (``connection``), the tool adapter (``adapter``) and the process's set of servers
(``manager``)."""
