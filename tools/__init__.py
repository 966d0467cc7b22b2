"""Agent tools, and the core contract modules over the delegation runtime they face."""
