"""The composition root: the one place that turns settings into a running Reveille.

It builds, in this order, settings -> storage (the ledger file and the session store under
``REVEILLE_HOME``, or both in PostgreSQL when ``REVEILLE_DATABASE_URL`` is set) -> the
delegation runtime of the contract module ``tools.async_delegation`` -> the model provider
and the agent with its toolset -> the API server -> the gateway runner, and hands each
piece down. Nothing below ``reveille/`` reads settings: the floors
under this one receive what they need from here.

``open_storage(url)`` (and the ``StorageLocation`` it returns) is the only code that names a
concrete storage backend.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import tools.async_delegation as ad
from agent import Agent, build_provider
from agent.providers.base import ModelProvider
from delivery.backend import LedgerBackend
from delivery.sqlite_backend import SqliteBackend
from delivery.sqlite_files import ensure_private_dir
from gateway.config import Platform
from gateway.platforms.api_server import ApiServerAdapter
from gateway.platforms.openai_wire import completion_object
from gateway.run import GatewayRunner, RunnerParts
from gateway.session import SessionStore
from gateway.turns import TurnService, agent_turn_runner
from reveille.settings import Settings, SettingsError
from tools.completion_queue import CompletionQueue
from tools.toolset import build_default_registry

__all__ = ["StorageLocation", "build_runner", "open_storage"]


@dataclass(frozen=True)
class StorageLocation:
    """Where the ledger and the session store live, parsed from a storage url: two SQLite
    files in a state directory, or one PostgreSQL database (``database_url``)."""

    ledger_path: Path | None
    sessions_path: Path | None
    database_url: str | None = None

    def open_ledger_backend(self) -> LedgerBackend:
        if self.database_url is not None:
            from delivery.postgres_backend import PostgresBackend

            return PostgresBackend(self.database_url)
        assert self.ledger_path is not None
        return SqliteBackend(self.ledger_path)

    def open_session_store(self) -> SessionStore:
        if self.database_url is not None:
            from delivery.postgres_sessions import PostgresSessions

            return SessionStore.over(PostgresSessions(self.database_url, migrate=False))
        assert self.sessions_path is not None
        return SessionStore(self.sessions_path)


def open_storage(url: str) -> StorageLocation:
    """Resolve a storage url: ``sqlite:///abs/dir`` (the state directory) or
    ``postgresql://user:password@host/dbname``.

    An unknown scheme is refused with a message that names the accepted ones, so that a
    typo in ``[storage] url`` stops the server at start instead of writing somewhere else.
    A PostgreSQL url is checked at once: the server is reached and the schema migrated (or
    refused when newer than this code), so a bad url, a refused connection or wrong
    credentials stop the start with one clear message (``LedgerUnavailable``).
    """
    parts = urlsplit(url)
    if parts.scheme in ("postgresql", "postgres"):
        from delivery.postgres_backend import prepare_database

        prepare_database(url)
        return StorageLocation(None, None, url)
    if parts.scheme != "sqlite":
        raise SettingsError(
            f"storage url {url!r}: unknown scheme; expected sqlite:///<directory> "
            "or postgresql://user:password@host/dbname"
        )
    if parts.netloc:
        raise SettingsError(f"storage url {url!r}: a sqlite url has no host (sqlite:///path)")
    home = Path(unquote(parts.path)).expanduser()
    try:
        ensure_private_dir(home)
    except OSError as exc:
        raise SettingsError(f"state directory {home}: {exc}") from None
    return StorageLocation(home / "ledger.db", home / "sessions.db")


def storage_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    return f"sqlite://{settings.home.expanduser().resolve().as_posix()}"


def build_runner(
    settings: Settings,
    *,
    provider: ModelProvider | None = None,
    shutdown_grace_seconds: float = 10.0,
) -> GatewayRunner:
    """A gateway runner wired from ``settings``; ``provider`` overrides the configured one
    (tests, benchmarks) and is then left open when the runner stops."""
    storage = open_storage(storage_url(settings))
    owns_provider = provider is None
    model = provider or build_provider(
        kind=settings.provider,
        base_url=settings.openai_base_url or None,
        api_key=settings.openai_api_key or None,
        model=settings.model,
        demo_delay=settings.demo_delay_seconds,
    )

    def open_runtime(queue: CompletionQueue) -> Any:
        return ad.configure_runtime(
            backend=storage.open_ledger_backend(),
            policy=settings.delivery_policy,
            completion_queue=queue,
            max_queued=settings.max_queued_delegations,
        )

    def build_adapter(store: SessionStore, model: ModelProvider) -> ApiServerAdapter:
        registry = build_default_registry(
            model,
            shell_enabled=settings.shell_enabled,
            workdir=settings.shell_workdir or None,
            max_async_children=settings.max_async_children,
        )
        turns = TurnService(
            store,
            agent_turn_runner(Agent(model, registry)),
            render=functools.partial(completion_object, model=model.name),
            platform=Platform.API_SERVER,
            max_concurrent_runs=settings.max_concurrent_runs,
        )
        return ApiServerAdapter(
            store=store,
            turns=turns,
            host=settings.host,
            port=settings.port,
            api_key=settings.api_key,
            model_name=model.name,
            allowed_origins=settings.allowed_origins,
            max_body_bytes=settings.max_body_bytes,
        )

    parts = RunnerParts(
        open_store=storage.open_session_store,
        open_runtime=open_runtime,
        provider=model,
        build_adapter=build_adapter,
        owns_provider=owns_provider,
    )
    return GatewayRunner(parts, shutdown_grace_seconds=shutdown_grace_seconds)
