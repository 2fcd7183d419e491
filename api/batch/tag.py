"""A batch's run ids: one per item, made of the batch's tag and the item's id, and so the names
of its items' workspaces."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path


def batch_tag(identity: str) -> str:
    """The tag of the batch known as ``identity``: for ``toolq batch`` its output file's
    resolved path (a rerun writing the same file uses the same workspaces), for the HTTP API its
    batch id."""
    return hashlib.sha256(identity.encode()).hexdigest()[:8]


#: Characters of an item id kept in its run_id; the hash suffix keeps shortened ids apart.
RUN_ID_ITEM_CHARS = 40

_NOT_IN_RUN_ID = re.compile(r"[^A-Za-z0-9._-]+")


def batch_tag_for_output(output: Path) -> str:
    """``toolq batch``'s tag, from its output file however it is spelt: reruns with the same
    output use the same workspaces."""
    return batch_tag(str(output.resolve()))


def batch_run_id(tag: str, item_id: str) -> str:
    """A run_id (and so a workspace) per item: readable, valid, and distinct for distinct ids."""
    readable = _NOT_IN_RUN_ID.sub("_", item_id)[:RUN_ID_ITEM_CHARS]
    digest = hashlib.sha256(item_id.encode()).hexdigest()[:6]
    return f"b-{tag}-{readable}-{digest}"
