"""Model providers: the offline demo model and any OpenAI-compatible endpoint."""

from __future__ import annotations

from agent.providers.base import ModelProvider, ModelReply, ProviderError
from agent.providers.demo import DemoModel
from agent.providers.openai_compat import OpenAICompatProvider

__all__ = [
    "DemoModel",
    "ModelProvider",
    "ModelReply",
    "OpenAICompatProvider",
    "ProviderError",
    "build_provider",
]


def build_provider(
    *,
    kind: str,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str | None = None,
    demo_delay: float = 1.0,
    timeout: float = 120.0,
) -> ModelProvider:
    """The provider named by `kind`: "demo" (offline, scripted) or "openai" (any compatible API)."""
    normalised = (kind or "").strip().lower()
    if normalised == "demo":
        return DemoModel(delay_seconds=demo_delay)
    if normalised == "openai":
        if not model:
            raise ValueError("the openai provider needs a model name (e.g. gpt-4o-mini)")
        return OpenAICompatProvider(base_url, api_key, model, timeout)
    raise ValueError(f"unknown provider kind {kind!r}; expected 'demo' or 'openai'")
