"""Markers that tag machine-written messages, so models and front ends can tell them apart.

`gateway.wake.format_wake_text` puts WAKE_MARKER on the first line of every wake-up text;
front ends that fold delivered results into a turn's context tag them with DELIVERY_MARKER;
sub-agent runs carry SUBAGENT_MARKER in their system message.
"""

WAKE_MARKER = "[reveille:wake]"
DELIVERY_MARKER = "[reveille:delivery]"
SUBAGENT_MARKER = "[reveille:subagent]"
