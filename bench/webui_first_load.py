"""The web UI's first load: bytes, requests and time to interactive, in Debian's chromium.

Starts `reveille serve` (demo model, a fresh state directory) with its web UI on a free
loopback port, then loads ``/`` ``--runs`` times, each in a fresh browser context (a cold
cache), with Playwright driving ``/usr/bin/chromium``. Counts every request the page makes
until it is interactive and the bytes they transferred (response bodies plus headers as
chromium reports them; the event stream counts as one request, its bytes as they arrived).

"Interactive" is the moment the UI says it is ready (``#app[data-ready=true]``: bootstrap
fetched, the event stream open, the session list rendered) and the composer accepts input.
Also prints DOMContentLoaded and the load event from the Navigation Timing API.

Usage: python bench/webui_first_load.py [--runs 5] [--url http://127.0.0.1:8787]
(``--url`` measures a server that is already running instead of starting one.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.webui.browser._support import CHROMIUM, CHROMIUM_ARGS, free_port  # noqa: E402


@contextlib.contextmanager
def reveille_webui() -> Iterator[str]:
    """`reveille serve` with its web UI in a temporary state directory; yields its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="reveille-bench-") as home:
        env = {
            **os.environ,
            "REVEILLE_HOME": home,
            "REVEILLE_WEBUI_PORT": str(port),
            "API_SERVER_KEY": "bench-key",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        env.pop("REVEILLE_CONFIG", None)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from reveille.cli import main; sys.exit(main(sys.argv[1:]))",
                "serve",
                "--port",
                "0",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(url + "/api/bootstrap", timeout=2).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("reveille serve did not start its web UI") from None
                    time.sleep(0.1)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def one_load(browser: Any, url: str) -> dict[str, float]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    sizes: dict[Any, int] = {}
    requests: list[Any] = []

    def on_request(request: Any) -> None:
        requests.append(request)

    def on_finished(request: Any) -> None:
        with contextlib.suppress(Exception):
            size = request.sizes()
            sizes[request] = int(size["responseBodySize"]) + int(size["responseHeadersSize"])

    page.on("request", on_request)
    page.on("requestfinished", on_finished)
    start = time.perf_counter()
    page.goto(url + "/", wait_until="commit")
    page.wait_for_selector("#app[data-ready=true]", timeout=30000)
    page.get_by_test_id("composer").fill("x")
    interactive = time.perf_counter() - start
    timing = page.evaluate(
        """() => {
          const n = performance.getEntriesByType('navigation')[0];
          return {dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd};
        }"""
    )
    count = len(requests)
    body = sum(sizes.values())
    # the event stream is still open: what chromium received on it so far
    body += sum(
        int(entry["transferSize"])
        for entry in page.evaluate(
            "performance.getEntriesByType('resource').map(e => ({name: e.name, "
            "transferSize: e.transferSize}))"
        )
        if "/api/events" in entry["name"]
    )
    context.close()
    return {
        "requests": count,
        "bytes": body,
        "interactive_ms": interactive * 1000,
        "dcl_ms": float(timing["dcl"]),
        "load_ms": float(timing["load"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--url", help="measure this running web UI instead of starting one")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(reveille_webui())
        playwright = stack.enter_context(sync_playwright())
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        one_load(browser, url)  # warm the server (and chromium), not the page's cache
        runs = [one_load(browser, url) for _ in range(args.runs)]
        browser.close()

    def med(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    print(f"web UI first load, {args.runs} cold loads of {url}/ (median)")
    print(f"  requests until interactive: {med('requests'):.0f}")
    print(f"  bytes transferred:          {med('bytes') / 1024:.1f} KiB ({med('bytes'):.0f} B)")
    print(f"  DOMContentLoaded:           {med('dcl_ms'):.0f} ms")
    print(f"  load event:                 {med('load_ms'):.0f} ms")
    print(f"  time to interactive:        {med('interactive_ms'):.0f} ms")
    worst = max(run["interactive_ms"] for run in runs)
    print(f"  slowest time to interactive: {worst:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
