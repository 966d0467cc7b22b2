"""A background process's files and the wrapper that writes them: the part of a command
that outlives the server which started it.

``start_wrapper`` runs a command under a small wrapper (``python -I -S -c``, its own session
leader) whose output goes to ``<dir>/output`` and whose exit status is written (temp +
rename) to ``<dir>/exit`` once it ends; ``<dir>/wrapper`` holds the wrapper's identity (pid
and start time, safe against pid reuse). Anyone who knows the directory can read the output
(``read_output_tail``; a watch tails the same file), the status (``read_exit_status``) and
stop the command's whole group (``stop_group``). ``tools.background_processes`` follows the
processes and records their completions.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from delivery.identity import ProcessIdentity, current_identity, process_start_ticks
from delivery.state_dir import ensure_private_dir

log = logging.getLogger(__name__)

OUTPUT_TAIL_BYTES = 16 * 1024
KILL_GRACE_SECONDS = 3.0  # a stopped command's group gets TERM, then KILL after this
PROCESSES_DIR = "processes"
OUTPUT_FILE = "output"
EXIT_FILE = "exit"
WRAPPER_FILE = "wrapper"

# argv[1]: the process directory, argv[2]: the command. The wrapper starts the command only
# once the server has written its identity and says "go" (a server killed before that leaves
# nothing running that no one could find). It survives a TERM (kill() signals the whole
# group) to record the command's status, and passes on one that came before the command
# started; the command gets the default disposition of every standard signal from its first
# instruction (posix_spawn's setsigdef): SIGPIPE and SIGXFSZ too, which Python ignores (as
# Popen restores them), and any the server inherited ignored (SIGQUIT and SIGINT, started
# with ``&`` by a script; SIGHUP, under nohup). It gets /dev/null as stdin and the caller's
# umask. The status is
# Popen's: the exit code, or minus the signal that killed the command.
WRAPPER_SCRIPT = """\
import os, signal, sys
d, command = sys.argv[1], sys.argv[2]
if sys.stdin.buffer.readline() != b"go\\n":
    sys.exit(125)
child = 0
got = []
def send(signum):
    try:
        os.kill(child, signum)
    except OSError:
        pass  # it has ended (and may be reaped): nothing to pass on
def on_signal(signum, frame):
    got.append(signum)
    if child:
        send(signum)
sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
for s in sigs:
    signal.signal(s, on_signal)
out = os.path.join(d, "output")
unchangeable = (signal.SIGKILL, signal.SIGSTOP)
defaults = [s for s in signal.valid_signals() if 0 < s < 32 and s not in unchangeable]
child = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", command], os.environ, file_actions=[
    (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
    (os.POSIX_SPAWN_OPEN, 1, out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
    (os.POSIX_SPAWN_DUP2, 1, 2),
], setsigdef=defaults)
if got:
    send(got[0])
code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
tmp = os.path.join(d, "exit.tmp")
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, b"%d\\n" % code)
os.close(fd)
os.replace(tmp, os.path.join(d, "exit"))
sys.exit(code if code >= 0 else 128 - code)
"""


class _Tail:
    """The last ``limit`` bytes of a stream."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._limit = limit
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        self.total += len(chunk)
        while self._size - len(self._chunks[0]) >= self._limit:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        data = b"".join(self._chunks)[-self._limit :]
        return data.decode("utf-8", errors="replace")


def read_output_tail(path: Path, limit: int = OUTPUT_TAIL_BYTES) -> tuple[str, int]:
    """The last ``limit`` bytes of an output file, decoded, and the file's size."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(size - limit, 0))
            data = fh.read(limit)
    except FileNotFoundError:
        return "", 0
    return data.decode("utf-8", errors="replace"), size


def read_exit_status(directory: Path) -> tuple[int, float] | None:
    """The exit code the wrapper recorded and when (the file's mtime), or None."""
    path = directory / EXIT_FILE
    try:
        text = path.read_text()
        ended = path.stat().st_mtime
        return int(text.split()[0]), ended
    except (OSError, ValueError, IndexError):
        return None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` 0600, atomically (temp + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def read_wrapper_identity(directory: Path) -> ProcessIdentity | None:
    try:
        return ProcessIdentity.parse((directory / WRAPPER_FILE).read_text().strip())
    except OSError:
        return None


def stop_group(pgid: int) -> None:
    """TERM the process group ``pgid`` (the wrapper records the command's status), and KILL
    what is left of it once ``KILL_GRACE_SECONDS`` are over: the whole tree goes."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    timer = threading.Timer(KILL_GRACE_SECONDS, _kill_group, args=(pgid,))
    timer.daemon = True
    timer.start()


def _kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` if it still has members. A group's id cannot be
    given to a new process while the group exists, so this never reaches a stranger."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, 0)
        os.killpg(pgid, signal.SIGKILL)
        log.info("process group %s outlived its TERM: killed", pgid)


def alive(ident: ProcessIdentity | None) -> bool:
    return ident is not None and ident.is_local() and not ident.is_known_dead()


def start_wrapper(
    directory: Path, command: str, *, cwd: str | None, env: dict[str, str] | None
) -> subprocess.Popen[bytes]:
    """The wrapper, running ``command`` once its identity is on disk."""
    ensure_private_dir(directory.parent)
    ensure_private_dir(directory)
    os.close(os.open(directory / OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", WRAPPER_SCRIPT, str(directory), command],
        cwd=cwd,
        env={**os.environ, **env} if env else None,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Its own session: neither a signal to the server's group nor the server's death
        # reaches it, and kill() reaches the command's children through its group.
        start_new_session=True,
    )
    assert proc.stdin is not None
    try:
        me = current_identity()
        # Not reaped yet, so the pid is still this child's.
        ticks = process_start_ticks(proc.pid) or 0
        ident = ProcessIdentity(me.host, me.boot_id, proc.pid, ticks)
        write_private(directory / WRAPPER_FILE, f"{ident}\n")
        proc.stdin.write(b"go\n")
    except OSError:
        proc.kill()
        proc.wait()
        raise
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    return proc
