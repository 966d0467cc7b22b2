"""Slack as a chat surface: ``adapter`` (the port's implementation over slack-sdk),
``format`` (mrkdwn and the split), ``intake`` (events, presses, the chat of a message),
``approvals`` (Block Kit buttons), ``socket`` (Socket Mode) and ``http`` (the Events API and
interactivity, signed)."""

from gateway.surfaces.slack.adapter import SlackAdapter

__all__ = ["SlackAdapter"]
