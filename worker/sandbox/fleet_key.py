"""The fleet's own secret: what makes a run's first uid unpredictable, and what names the fleet
to the other fleets on a host.

It is made once (32 random bytes) in the fleet's state folder under its workspace root, which
the fleet's hosts share and no run can read (``.toolq``, mode 0700; the key itself 0600). A run
that picks its own id therefore cannot tell which uid it will be given, nor aim at another run's;
and two fleets whose workspace roots have the same path in two mount namespaces still have two
names.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from worker.contract.fleet_secret import write_once
from worker.state_folder import STATE_DIR

KEY_FILE = "fleet-key"
_KEY_BYTES = 32
#: A fleet's name where it has no workspace root to keep a key in (a bare sandbox in tests).
UNROOTED = "unrooted"


def fleet_key(root: Path) -> bytes:
    """The key of the fleet whose workspace root is ``root``, made now if it has none.

    Written aside and linked into place, so two workers making it at once agree on one key and
    no reader ever sees half of it."""
    key = Path(root) / STATE_DIR / KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        return _read(key)
    write_once(key, secrets.token_bytes(_KEY_BYTES))
    return _read(key)


def fleet_id(root: Path | None) -> str:
    """The fleet's name on a host: derived from its key, so it says nothing of the key."""
    if root is None:
        return UNROOTED
    return _named(fleet_key(root))


def _named(key: bytes) -> str:
    return hmac.new(key, b"toolq fleet id", hashlib.sha256).hexdigest()[:32]


def existing_fleet_id(root: Path) -> str | None:
    """``fleet_id`` of ``root`` if it has a key; None, and no key made, if it has none."""
    try:
        key = _read(Path(root) / STATE_DIR / KEY_FILE)
    except FileNotFoundError:
        return None
    return _named(key)


def first_uid_offset(root: Path, run_id: str, size: int) -> int:
    """Where in a range of ``size`` uids the search for ``run_id``'s starts: a keyed hash, so
    that a run already holding one is found at once and nobody outside can aim at one."""
    digest = hmac.new(fleet_key(root), run_id.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") % size


def _read(key: Path) -> bytes:
    fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != _KEY_BYTES:
        raise OSError(f"{key} is not a fleet key ({len(data)} bytes, not {_KEY_BYTES})")
    return data
