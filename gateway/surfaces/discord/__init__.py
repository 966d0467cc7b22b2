"""Discord as a chat surface: ``adapter`` (the port's implementation over discord.py),
``format`` (markdown and the 2,000-character split), ``approvals`` (buttons and presses) and
``intake`` (the chat of a message, its session, the reply records)."""

from gateway.surfaces.discord.adapter import DiscordAdapter

__all__ = ["DiscordAdapter"]
