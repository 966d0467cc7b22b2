"""The shared consumer-lease loop (``gateway.surfaces.leased_intake``) as Slack uses it: a
consumer that ends refused (a wrong app token) is said once and never started again, and
its lease is released for nobody; one that fails otherwise is started again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

import pytest

from agent.messages import JSONObject
from gateway.surfaces.leased_intake import IntakeWords, LeasedIntake
from gateway.surfaces.slack.tokens import SlackTokenRefused

WORDS = IntakeWords("Slack", "event", "holding ({bot})", "standing by", "ended ({error!r})")


class State:
    """The store's side, in memory: the lease always granted, no orphans."""

    lease_seconds = 0.03

    def __init__(self) -> None:
        self.released = 0

    def renew(self, bot: str) -> None:
        return None

    def claim_orphans(
        self, bot: str, in_hand: Collection[int] = ()
    ) -> list[tuple[int, JSONObject]]:
        return []

    def hold_poll_lease(self, bot: str) -> bool:
        return True

    def release_poll_lease(self, bot: str) -> None:
        self.released += 1


class Failing:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.runs = 0

    async def run(self) -> None:
        self.runs += 1
        raise self.error


async def _run_for(intake: LeasedIntake, seconds: float) -> None:
    task = asyncio.create_task(intake.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_refused_consumer_is_said_once_and_not_started_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, consumer = State(), Failing(SlackTokenRefused("Slack refused SLACK_APP_TOKEN"))
    intake = LeasedIntake(state, "b", lambda *_: None, consumer, WORDS, final=(SlackTokenRefused,))
    with caplog.at_level(logging.INFO):
        await _run_for(intake, 0.5)
    assert consumer.runs == 1
    assert state.released == 1
    said = [r.getMessage() for r in caplog.records if "SLACK_APP_TOKEN" in r.getMessage()]
    assert said == ["Slack: stopped for good: Slack refused SLACK_APP_TOKEN"]
    assert not intake.consuming


async def test_a_consumer_that_fails_otherwise_is_started_again() -> None:
    state, consumer = State(), Failing(OSError("reset"))
    intake = LeasedIntake(state, "b", lambda *_: None, consumer, WORDS, final=(SlackTokenRefused,))
    await _run_for(intake, 0.5)
    assert consumer.runs >= 2
    assert state.released == 0
