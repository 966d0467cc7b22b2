"""The module paths plugins and the seeds import stay importable after the layout moved
(SPEC.md: ``gateway.*`` are public contract), and name the same objects as their homes."""

from __future__ import annotations

import importlib

import gateway.adapter as adapter_home
import gateway.surfaces.api_server.adapter as api_server_home


def test_contract_modules_import() -> None:
    for name in (
        "gateway.config",
        "gateway.session",
        "gateway.wake",
        "gateway.run",
        "gateway.platforms.api_server",
        "gateway.platforms.base",
    ):
        assert importlib.import_module(name) is not None


def test_faces_hand_on_the_same_objects() -> None:
    base = importlib.import_module("gateway.platforms.base")
    api_server = importlib.import_module("gateway.platforms.api_server")
    for name in base.__all__:
        assert getattr(base, name) is getattr(adapter_home, name)
    for name in api_server.__all__:
        assert getattr(api_server, name) is getattr(api_server_home, name)
