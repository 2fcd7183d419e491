"""The fleet secret: what binds an answer to its call, held by callers and workers alone.

A worker seals each answer with an HMAC under a key of the call's own, derived from the fleet
secret and the call's id (``FleetSecret.seal_key``); a caller takes only an answer so sealed.
Nothing of it travels in a message or sits in the broker or the result store, so a party that
reached them (their password, a run that got through to them) can read every message and still
cannot seal an answer, nor replay one call's answer for another.

Where it comes from: ``TOOLQ_FLEET_SECRET_FILE`` (a file of the operator's, e.g. a Kubernetes
Secret mounted as a file), else a file made once in the user's private state folder
(``$XDG_STATE_HOME/toolq``, by default ``~/.local/state/toolq``, mode 0700, the file 0600), which
every process of that user on that host shares. Hosts do not share it: a fleet on several hosts
sets the file. A file that users other than its owner and group can read is refused, in one line
naming the setting.

An answer also says which secret sealed it (``secret_id``, a hash of it that tells nothing of
it), so a caller whose workers read another secret says so rather than wait in silence.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from worker.contract.errors import FleetSecretError

SECRET_SETTING = "TOOLQ_FLEET_SECRET_FILE"  # noqa: S105 (a variable's name)
DEFAULT_FILE_NAME = "fleet-secret"
#: Enough for HMAC-SHA256; a longer secret is used whole.
MIN_SECRET_BYTES = 32
_MAX_SECRET_BYTES = 4096
_SEAL_LABEL = b"toolq answer seal\x00"
_ID_LABEL = b"toolq fleet secret id"


@dataclass(frozen=True, slots=True)
class FleetSecret:
    """The secret of a fleet, as its callers and workers hold it."""

    value: bytes = field(repr=False)
    #: Where it was read from, for messages.
    path: Path

    @property
    def secret_id(self) -> str:
        """Names the secret in answers and messages without telling anything of it."""
        return hmac.new(self.value, _ID_LABEL, hashlib.sha256).hexdigest()[:16]

    def seal_key(self, task_id: str) -> str:
        """The key that seals the answer to call ``task_id``: of that call alone."""
        return hmac.new(self.value, _SEAL_LABEL + task_id.encode(), hashlib.sha256).hexdigest()


def default_secret_file() -> Path:
    """The user's own default: ``$XDG_STATE_HOME/toolq/fleet-secret``."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "toolq" / DEFAULT_FILE_NAME


def fleet_secret(configured: Path | str | None) -> FleetSecret:
    """The fleet secret from ``configured`` (``TOOLQ_FLEET_SECRET_FILE``), else the user's
    default file, made now if missing; read once per process and path."""
    if configured:
        return _read_secret(Path(configured).expanduser())
    return _default_secret(default_secret_file())


@lru_cache(maxsize=8)
def _read_secret(path: Path) -> FleetSecret:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise FleetSecretError(
            f"{SECRET_SETTING} {path}: cannot be read ({exc.strerror}); every worker and caller "
            "of a fleet must read the same secret file"
        ) from exc
    try:
        mode = os.fstat(fd).st_mode
        data = os.read(fd, _MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if not stat.S_ISREG(mode):
        raise FleetSecretError(f"{SECRET_SETTING} {path}: not a regular file")
    # Its group may read it (a Kubernetes Secret given to a pod's fsGroup): a run's uid has a
    # group of its own and no other.
    if mode & 0o007:
        raise FleetSecretError(
            f"{SECRET_SETTING} {path}: other users can read it (mode {stat.S_IMODE(mode):04o}); "
            "make it 0600, 0400 or 0440 (a Kubernetes Secret: defaultMode: 0440)"
        )
    value = data.strip()
    if not MIN_SECRET_BYTES <= len(value) <= _MAX_SECRET_BYTES:
        raise FleetSecretError(
            f"{SECRET_SETTING} {path}: holds {len(value)} bytes; a fleet secret is "
            f"{MIN_SECRET_BYTES} to {_MAX_SECRET_BYTES} bytes (e.g. openssl rand -hex 32)"
        )
    return FleetSecret(value, path)


def _default_secret(path: Path) -> FleetSecret:
    if os.path.lexists(path):
        return _read_secret(path)
    try:
        make_secret_file(path)
    except OSError as exc:
        raise FleetSecretError(
            f"cannot make the fleet secret {path} ({exc.strerror}); set {SECRET_SETTING}"
        ) from exc
    return _read_secret(path)


def make_secret_file(path: Path) -> None:
    """A new random secret at ``path`` (its folder made 0700), unless one is there already."""
    write_once(path, secrets.token_hex(MIN_SECRET_BYTES).encode())


def write_once(path: Path, content: bytes) -> None:
    """``content`` at ``path`` (mode 0600, its folder made 0700), unless a file is there
    already. Written aside and linked into place: two processes writing it at once agree on one
    content, and no reader ever sees half of it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    draft = path.parent / f".{path.name}.{secrets.token_hex(8)}"
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as draft_file:
        draft_file.write(content)
    try:
        with contextlib.suppress(FileExistsError):
            os.link(draft, path)
    finally:
        os.unlink(draft)
