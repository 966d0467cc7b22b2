"""The agent loop and model providers."""
