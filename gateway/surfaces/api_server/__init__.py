"""The API server surface: the OpenAI-compatible HTTP adapter and its routes."""
