"""The state directory (``REVEILLE_HOME``): private to its user, whatever keeps files in it.

The ledger, the session store, process outputs and the web UI's files all live there, and
they hold private conversations: the directory is created 0700, an existing one that
others may read is tightened, and a shared one (another user's, or sticky like /tmp) is
refused rather than written into.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["ensure_private_dir", "tighten"]

log = logging.getLogger(__name__)


def tighten(path: str, mode: int) -> bool:
    """chmod ``path`` to ``mode`` when others may read it and this user owns it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    if not st.st_mode & 0o077 or st.st_uid != os.geteuid():
        return False
    os.chmod(path, mode)
    log.warning(
        "tightened %s from %o to %o: it holds private conversations",
        path,
        stat.S_IMODE(st.st_mode),
        mode,
    )
    return True


def ensure_private_dir(path: str | Path) -> None:
    """Create the state directory 0700, or tighten an existing one that others may read.

    Raises PermissionError (with a message that says what to do) for a directory that is
    open to others and cannot be tightened: another user's, or a shared one such as /tmp
    (sticky), whose permissions are not ours to change.
    """
    path = str(Path(path).expanduser())
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if not st.st_mode & 0o077:
        return
    if st.st_uid != os.geteuid() or st.st_mode & stat.S_ISVTX:
        raise PermissionError(
            f"the state directory {path} is open to other users (mode "
            f"{stat.S_IMODE(st.st_mode):o}) and is not one to tighten; point REVEILLE_HOME "
            "at a private directory"
        )
    tighten(path, 0o700)
