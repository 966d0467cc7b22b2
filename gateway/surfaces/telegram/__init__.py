"""The Telegram surface: the Bot API adapter (implements ``gateway.surfaces.port``)."""
