"""The size and count limits both sides apply, each stated once: the output caps, the transfer
limit, how many files or runs one answer lists; and text cut to a cap on a character boundary,
with a notice."""

from __future__ import annotations

#: The longest answer a tool gives, in bytes of UTF-8, unless ``TOOLQ_OUTPUT_CAP_BYTES`` says.
DEFAULT_OUTPUT_CAP_BYTES = 51_200
#: The most bytes one service operation moves unless ``TOOLQ_TRANSFER_MAX_BYTES`` says: files
#: read or written whole, a command's output stream. Inspect reads files up to 100 MiB.
DEFAULT_TRANSFER_MAX_BYTES = 100 * 1024 * 1024
#: The most files one ``toolq.collect_files`` answer holds (a batch item's artifacts).
MAX_COLLECTED_FILES = 100
#: The most run ids one ``toolq.list_workspaces`` answer holds; it says how many matched.
MAX_LISTED_RUNS = 10_000
#: Room kept under the cap for the notice a tool adds when it leaves something out.
NOTICE_RESERVE_BYTES = 512


def cap_in_words(cap_bytes: int) -> str:
    """A cap as a tool's description tells the model: ``50 KB`` for 51,200 bytes, else bytes."""
    if cap_bytes % 1024 == 0:
        return f"{cap_bytes // 1024:,} KB"
    return f"{cap_bytes:,} bytes"


def answer_budget(cap_bytes: int) -> int:
    """How many bytes of an answer a tool may fill before its closing notice.

    Half the cap at least: under a cap too small for the whole notice the generic cap still
    applies, and the answer keeps some content.
    """
    return max(cap_bytes - NOTICE_RESERVE_BYTES, cap_bytes // 2)


def fit_utf8(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` bytes of UTF-8 on a character boundary; whether cut."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return text, False
    # "ignore" drops a multi-byte character cut in half at the boundary.
    return encoded[:limit].decode("utf-8", "ignore"), True


def cap_text(text: str, cap_bytes: int) -> tuple[str, bool]:
    """``text`` within ``cap_bytes`` of UTF-8, notice included; and whether it was cut."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size <= cap_bytes:
        return text, False
    notice = f"\n[output truncated: {size:,} bytes in all, the first {cap_bytes:,} bytes shown]"
    head, _ = fit_utf8(text, max(cap_bytes - len(notice.encode()), 0))
    return head + notice, True
