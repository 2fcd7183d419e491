"""The API's tenants: who may call it, by bearer token, and whose runs and workspaces are whose.

A tenant is a name and a token. ``TOOLQ_API_TOKEN`` is the tenant named ``default``; each line
of ``TOOLQ_API_TOKENS_FILE`` (``<tenant-name> <token>``) is one more. Each run and batch is the
tenant's whose token started it: to any other tenant it does not exist. With no token at all the
API is open (on loopback only) and everything is the default tenant's.

A run's workspace is named by its ``options.run_id``, which each tenant chooses, so two tenants
may choose the same. With a tokens file the workers know a tenant's workspaces by the tenant's
name, a dot, and the run_id (``acme.my-run``): tenant names have no dot, so no tenant can name
another's workspace. With one token (or none) workspaces keep the run_id's own name.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pydantic import SecretStr

from api.exceptions import TokensFileError
from api.settings import OrchestratorSettings
from worker.contract.keys import DEFAULT_TENANT

#: A tenant's name: it starts workspace names and Redis keys, so no dot, no colon, no space.
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
#: The shortest token a tokens file may give: shorter ones can be guessed.
MIN_TOKEN_CHARS = 16
#: The longest run_id the workers take (``worker.contract.wire.RUN_ID_PATTERN``).
RUN_ID_CHARS = 128
#: Hex digits of a digest that stand for the end of a run_id too long to keep whole.
DIGEST_CHARS = 16
#: The settings that give tenants, as messages name them.
FILE_VARIABLE = "TOOLQ_API_TOKENS_FILE"
TOKEN_VARIABLE = "TOOLQ_API_TOKEN"  # noqa: S105 - a variable's name, not a secret


def read_tokens_file(path: Path, taken: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each tenant's token, by name, from ``path``: ``<tenant-name> <token>`` lines, ``#``
    comment lines and blank lines. ``taken`` holds tenants named elsewhere (name -> token), which
    the file may not name again nor share a token with. Never says a token in its errors."""
    try:
        content = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokensFileError(f"{FILE_VARIABLE}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TokensFileError(f"{FILE_VARIABLE}: {path} is not UTF-8 text") from None
    where_named = {name: f"{TOKEN_VARIABLE}'s" for name in taken or {}}
    by_token = {token: name for name, token in (taken or {}).items()}
    tokens: dict[str, str] = {}
    for number, line in enumerate(content.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"{FILE_VARIABLE} {path} line {number}"
        if len(words) != 2:
            raise TokensFileError(
                f"{where}: expected two words, '<tenant-name> <token>'; found {len(words)}"
            )
        name, token = words
        if not TENANT_NAME.match(name):
            raise TokensFileError(
                f"{where}: the tenant name {name!r} must be 1 to 32 letters, digits, '-' or '_',"
                " starting with a letter or a digit"
            )
        if name in where_named:
            raise TokensFileError(f"{where}: tenant {name!r} is named twice ({where_named[name]})")
        if len(token) < MIN_TOKEN_CHARS:
            raise TokensFileError(
                f"{where}: tenant {name!r}'s token has {len(token)} characters; it needs at least "
                f"{MIN_TOKEN_CHARS}"
            )
        if token in by_token:
            raise TokensFileError(
                f"{where}: tenant {name!r} has the same token as tenant {by_token[token]!r}"
            )
        where_named[name] = f"first on line {number}"
        by_token[token] = name
        tokens[name] = token
    if not tokens:
        raise TokensFileError(f"{FILE_VARIABLE}: {path} names no tenant")
    return tokens


@dataclass(frozen=True)
class Tenants:
    """One server's tenants and their tokens; none for an API open to all (on loopback)."""

    tokens: Mapping[str, SecretStr]
    #: Workspaces are named by tenant: a tokens file is in use.
    scoped: bool = False

    @classmethod
    def from_settings(cls, settings: OrchestratorSettings) -> Tenants:
        """``TOOLQ_API_TOKEN``'s tenant and ``TOOLQ_API_TOKENS_FILE``'s; ``TokensFileError``
        says what is wrong with the file."""
        tokens: dict[str, str] = {}
        if settings.api_token is not None:
            tokens[DEFAULT_TENANT] = settings.api_token.get_secret_value()
        if settings.api_tokens_file is not None:
            tokens.update(read_tokens_file(settings.api_tokens_file, dict(tokens)))
        return cls(
            {name: SecretStr(token) for name, token in tokens.items()},
            scoped=settings.api_tokens_file is not None,
        )

    @property
    def is_open(self) -> bool:
        """No token at all: every request is the default tenant's."""
        return not self.tokens

    @property
    def names(self) -> list[str]:
        return list(self.tokens) or [DEFAULT_TENANT]

    @property
    def which_token(self) -> str:
        """Where a caller's token comes from, as the 401 answers say it."""
        if not self.scoped:
            return TOKEN_VARIABLE
        if DEFAULT_TENANT in self.tokens:
            return f"{TOKEN_VARIABLE} or a token of {FILE_VARIABLE}"
        return f"a token of {FILE_VARIABLE}"

    def identify(self, presented: str) -> str | None:
        """The tenant whose token ``presented`` is, or None. Every token is compared, in
        constant time, so how long this takes says nothing about which token came close."""
        digest = _digest(presented)
        found = None
        for name, expected in self._digests.items():
            if hmac.compare_digest(digest, expected):
                found = name
        return found

    def workspace(self, tenant: str, run_id: str) -> str:
        """What the workers call ``tenant``'s workspace ``run_id``: the tenant's name, a dot,
        and the run_id, where that is within what the workers take; else the run_id's start and
        a digest of it."""
        if not self.scoped:
            return run_id
        scoped = f"{tenant}.{run_id}"
        if len(scoped) <= RUN_ID_CHARS:
            return scoped
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:DIGEST_CHARS]
        kept = run_id[: RUN_ID_CHARS - len(tenant) - 2 - DIGEST_CHARS]
        return f"{tenant}.{kept}-{digest}"

    @cached_property
    def _digests(self) -> dict[str, bytes]:
        return {name: _digest(token.get_secret_value()) for name, token in self.tokens.items()}


def _digest(token: str) -> bytes:
    # Digests are all as long: compare_digest's time then depends on neither token's length.
    return hashlib.sha256(token.encode()).digest()
