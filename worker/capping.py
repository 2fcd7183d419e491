"""The output cap: no answer longer than the limit, cut on a character boundary, with a notice."""

from __future__ import annotations


def cap_text(text: str, cap_bytes: int) -> tuple[str, bool]:
    """``text`` within ``cap_bytes`` of UTF-8, notice included; and whether it was cut."""
    encoded = text.encode("utf-8", errors="surrogatepass")
    if len(encoded) <= cap_bytes:
        return text, False
    notice = (
        f"\n[output truncated: {len(encoded):,} bytes in all, the first {cap_bytes:,} bytes shown]"
    )
    keep = max(cap_bytes - len(notice.encode()), 0)
    # errors="ignore" drops a multi-byte character cut in half at the boundary.
    head = encoded[:keep].decode("utf-8", errors="ignore")
    return head + notice, True
