"""Gateway: sessions, the turn service (``turns/``), wake delivery and the runner, the HTTP
plumbing (``http/``) and OpenAI wire formats (``openai/``), and the surfaces (``surfaces/``:
the surface port and one package per platform)."""
