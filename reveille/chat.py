"""`reveille chat`: a small terminal client for a running `reveille serve`.

`reveille chat [--url URL] [--key KEY] [--session ID]` talks to the server with the
official ``openai`` client, shows the session id, streams replies, and while idle polls
``GET /api/sessions/{id}/messages`` every 2 s so wake-ups and delivered background results
show up as they arrive.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from agent.messages import JSONObject

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

__all__ = ["ChatClient", "add_chat_parser", "render_message", "run_chat"]

logger = logging.getLogger("reveille.chat")

DEFAULT_URL = "http://127.0.0.1:8642/v1"
POLL_SECONDS = 2.0


def add_chat_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "chat",
        help="a small terminal client for a running `reveille serve`",
        description=(
            "Chat with a running Reveille server. Wake-ups and background results appear "
            "while you are idle. Ctrl-D or /quit leaves."
        ),
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("REVEILLE_URL") or DEFAULT_URL,
        help=f"the server's /v1 URL (default $REVEILLE_URL or {DEFAULT_URL})",
    )
    parser.add_argument(
        "--key",
        default=os.environ.get("API_SERVER_KEY") or None,
        help="bearer key (default $API_SERVER_KEY)",
    )
    parser.add_argument("--session", help="continue this session id (needs a key)")
    parser.add_argument("--model", default=None, help="model name to send (default: the server's)")
    parser.set_defaults(func=run_chat)
    return parser


class ChatClient:
    """The logic of `reveille chat`, without the terminal: easy to drive from tests.

    With a key every turn sends only the new message and continues the session by
    ``X-Hermes-Session-Id``. Without one the server refuses that header, so the client
    resends the whole conversation and the server derives the same session id from it.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        key: str | None = None,
        session_id: str | None = None,
        model: str | None = None,
        timeout: float = 300.0,
    ) -> None:
        import openai

        self.url = url.rstrip("/")
        self.root = self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url
        self.key = key or None
        self.session_id = session_id
        self.history: list[dict[str, str]] = []
        self.last_seen = 0
        self._own_ids: set[int] = set()
        self.client = openai.OpenAI(
            base_url=self.url, api_key=self.key or "no-key", max_retries=2, timeout=timeout
        )
        self.model = model or self._server_model()

    def close(self) -> None:
        self.client.close()

    def _request(self, method: str, path: str, body: JSONObject | None = None) -> tuple[int, Any]:
        """A small JSON request to the sessions API (stdlib only)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.root + path, data=data, method=method)
        if self.key:
            request.add_header("Authorization", f"Bearer {self.key}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read() or b"null")
            except ValueError:
                return exc.code, None

    def _server_model(self) -> str:
        try:
            models = self.client.models.list()
            if models.data:
                return models.data[0].id
        except Exception:  # the server may be busy: guess its default (the demo model)
            logger.debug("could not list models", exc_info=True)
        return "reveille-demo"

    def open_session(self) -> str | None:
        """Create (or check) the session when a key allows continuing it."""
        if self.key is None:
            if self.session_id:
                raise SystemExit("reveille chat: --session needs a key (--key or API_SERVER_KEY)")
            return None
        if self.session_id:
            status, body = self._request("GET", f"/api/sessions/{self.session_id}")
            if status == 404:
                raise SystemExit(f"reveille chat: session {self.session_id} does not exist")
            if status != 200:
                raise SystemExit(f"reveille chat: the server answered HTTP {status}: {body}")
            # Start after what is already there.
            self.last_seen = max((m["id"] for m in self._fetch(0)), default=0)
        else:
            status, body = self._request("POST", "/api/sessions", {"title": "reveille chat"})
            if status not in (200, 201):
                raise SystemExit(f"reveille chat: the server answered HTTP {status}: {body}")
            self.session_id = body["id"]
        return self.session_id

    def send(self, text: str, on_delta: Any = None) -> str:
        """One turn; streams pieces to ``on_delta``; returns the whole reply."""
        extra_headers = {}
        if self.key is not None and self.session_id:
            extra_headers["X-Hermes-Session-Id"] = self.session_id
            turn: list[dict[str, str]] = [{"role": "user", "content": text}]
        else:
            turn = [*self.history, {"role": "user", "content": text}]
        messages = cast("list[ChatCompletionMessageParam]", turn)
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=messages, stream=True, extra_headers=extra_headers
        )
        self.session_id = raw.headers.get("X-Hermes-Session-Id") or self.session_id
        pieces: list[str] = []
        # stream=True: the parsed body is the chunk stream (the stubs also allow a completion)
        for chunk in cast("Iterable[ChatCompletionChunk]", raw.parse()):
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces.append(choice.delta.content)
                    if on_delta is not None:
                        on_delta(choice.delta.content)
        reply = "".join(pieces)
        self.history += [
            {"role": "user", "content": text},
            {"role": "assistant", "content": reply},
        ]
        # Our own turn is already on screen: poll() skips it (and shows anything else).
        fresh = self._fetch(self.last_seen)
        for index in range(len(fresh) - 1, -1, -1):
            if fresh[index]["role"] == "user" and fresh[index]["content"] == text:
                self._own_ids.add(int(fresh[index]["id"]))
                replies = [m for m in fresh[index + 1 :] if m["role"] == "assistant"]
                if replies:
                    self._own_ids.add(int(replies[0]["id"]))
                break
        return reply

    def _fetch(self, after_id: int) -> list[Mapping[str, Any]]:  # transcript rows, read only
        if not self.session_id:
            return []
        status, body = self._request(
            "GET", f"/api/sessions/{self.session_id}/messages?after_id={int(after_id)}"
        )
        if status != 200 or not isinstance(body, dict):
            return []
        return list(body.get("data") or [])

    def poll(self) -> list[str]:
        """Printable lines for messages that arrived since the last look."""
        out: list[str] = []
        for message in self._fetch(self.last_seen):
            self.last_seen = max(self.last_seen, int(message["id"]))
            if int(message["id"]) in self._own_ids:
                self._own_ids.discard(int(message["id"]))
                continue
            out.append(render_message(message))
            if message["role"] == "assistant":
                self.history.append({"role": "assistant", "content": message["content"]})
        return out


def _summaries(message: Mapping[str, Any]) -> list[str]:
    """One line per completion in a delivery row or wake-up: from the row's structured
    ``display_metadata`` (``delivery.events.display_metadata``) when it has one, else from the
    data line the wake text carries; only texts with neither are read as prose."""
    from agent.providers.demo_summaries import summarise_completion_text, summarise_metadata

    content = str(message.get("content") or "")
    meta = message.get("display_metadata")
    if isinstance(meta, Mapping) and meta.get("kind"):
        lines = summarise_metadata(meta)
        if lines:
            return lines
    return summarise_completion_text(content) or [content.splitlines()[0] if content else ""]


def render_message(message: Mapping[str, Any]) -> str:
    """One compact line (or a few) for a transcript message that arrived while idle."""
    from agent.markers import WAKE_MARKER

    content = str(message.get("content") or "")
    if message.get("display_kind"):
        return "\n".join(f"[background result] {line}" for line in _summaries(message))
    meta = message.get("display_metadata")
    if message.get("role") == "system" and isinstance(meta, Mapping) and "summary" in meta:
        return "[compaction] earlier messages were summarised for the model (still stored)"
    if message.get("role") == "user":
        if content.startswith(WAKE_MARKER):
            return "\n".join(f"[wake-up] {line}" for line in _summaries(message))
        return f"you (elsewhere): {content}"
    return f"reveille: {content}"


class _LineReader:
    """Lines from stdin with a timeout: select() on the raw descriptor where it can wait on
    one (lines are split here, so none sits unseen in a buffer), a reader thread elsewhere."""

    def __init__(self) -> None:
        self._queue: queue.Queue[str | None] | None = None
        self._buffer = b""
        self._eof = False
        self._fd = -1
        try:
            self._fd = sys.stdin.fileno()
        except (OSError, ValueError, AttributeError):
            self._fd = -1
        if self._fd < 0 or os.name == "nt":
            self._queue = queue.Queue()
            threading.Thread(target=self._pump, name="chat-stdin", daemon=True).start()

    def _pump(self) -> None:
        assert self._queue is not None
        for line in sys.stdin:
            self._queue.put(line)
        self._queue.put(None)

    def get(self, timeout: float) -> str | None:
        """The next line, None at end of input; raises queue.Empty after ``timeout``."""
        if self._queue is not None:
            return self._queue.get(timeout=timeout)
        import select

        while b"\n" not in self._buffer and not self._eof:
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                raise queue.Empty
            chunk = os.read(self._fd, 4096)
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True
        if b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            return line.decode("utf-8", errors="replace") + "\n"
        if self._buffer:
            line, self._buffer = self._buffer, b""
            return line.decode("utf-8", errors="replace")
        return None


def server_unreachable(url: str) -> str | None:
    """Why the server at ``url`` cannot be reached, or None when its /health answers."""
    root = url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    try:
        with urllib.request.urlopen(root + "/health", timeout=5):
            return None
    except urllib.error.HTTPError:
        return None  # something answers; the chat reports what it says
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason) or type(exc).__name__


def run_chat(args: argparse.Namespace) -> int:
    # The HTTP client logs every request at INFO: noise in a chat window.
    for name in ("httpx", "httpx2", "openai", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    problem = server_unreachable(args.url)
    if problem is not None:
        print(
            f"reveille chat: cannot connect to {args.url} ({problem}). Is `reveille serve` "
            "running? Start it with `bash scripts/serve`, or pass --url.",
            file=sys.stderr,
        )
        return 1
    chat = ChatClient(url=args.url, key=args.key, session_id=args.session, model=args.model)
    try:
        chat.open_session()
        print(f"Connected to {chat.url} (model {chat.model}).")
        if chat.session_id:
            print(f"Session: {chat.session_id}")
        else:
            print(
                "No key: the session id is derived from the conversation (shown after the "
                "first reply)."
            )
        print("Type a message; /quit or Ctrl-D leaves.")
        reader = _LineReader()
        print("> ", end="", flush=True)
        while True:
            try:
                line = reader.get(POLL_SECONDS)
            except queue.Empty:
                arrived = chat.poll()
                if arrived:
                    print("\r" + "\n".join(arrived) + "\n> ", end="", flush=True)
                continue
            if line is not None:
                line = line.rstrip("\n")
            if line is None or line.strip() in ("/quit", "/exit"):
                print()
                return 0
            if not line.strip():
                print("> ", end="", flush=True)
                continue
            known = chat.session_id
            print("reveille: ", end="", flush=True)
            try:
                chat.send(line, on_delta=lambda piece: print(piece, end="", flush=True))
            except Exception as exc:  # keep the session going after a refused turn
                print(f"\n[error] {exc}", end="")
            print()
            if chat.session_id and chat.session_id != known:
                print(f"(session {chat.session_id})")
            print("> ", end="", flush=True)
    finally:
        chat.close()
