"""The floors of SPEC.md's layout hold for tools/ and agent/, and the faces keep their names."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import tools.async_delegation as ad
import tools.background_processes as bg
import tools.completion_queue as cq
import tools.delegation_runtime as dr
import tools.process_registry as pr

REPO = Path(__file__).resolve().parents[2]


def _loaded_after(imports: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after ``imports``."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        {imports}
        print(" ".join(sorted({{m.split(".")[0] for m in sys.modules}})))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return set(out.stdout.split())


def test_tools_never_import_the_shell_or_the_surfaces() -> None:
    loaded = _loaded_after(
        "import tools.async_delegation, tools.process_registry, tools.toolset; "
        "tools.async_delegation.get_runtime"
    )
    assert {"tools", "delivery", "agent"} <= loaded
    assert not loaded & {"reveille", "gateway", "api"}


def test_agent_never_imports_tools() -> None:
    loaded = _loaded_after("import agent, agent.loop, agent.tools, agent.providers")
    assert "agent" in loaded
    assert not loaded & {"tools", "reveille", "gateway", "api"}


def test_the_faces_hand_out_the_same_objects() -> None:
    assert ad.get_runtime is dr.get_runtime and ad.DelegationRuntime is dr.DelegationRuntime
    for name in ("configure_runtime", "reset_runtime", "runtime_is_open", "open_runtime"):
        assert getattr(ad, name) is getattr(dr, name)
    assert ad.register_runtime_factory is dr.register_runtime_factory
    assert pr.CompletionQueue is cq.CompletionQueue and pr.ProcessRegistry is bg.ProcessRegistry
    assert pr.process_registry is bg.process_registry
    assert pr.process_registry.completion_queue is cq.shared_completion_queue
    assert pr.OUTPUT_TAIL_BYTES == bg.OUTPUT_TAIL_BYTES and pr._Tail is bg._Tail
    assert set(ad.__all__) <= set(dir(ad)) and set(pr.__all__) <= set(dir(pr))
