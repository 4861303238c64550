"""Plain-text tables for people reading a terminal: one helper for every report the toolkit prints."""

from __future__ import annotations

from collections.abc import Sequence


def columns(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, no trailing blanks (diff- and grep-friendly)."""
    body = [tuple(str(v) for v in r) for r in rows]
    widths = [max(len(r[i]) for r in [tuple(head), *body]) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                     for r in [tuple(head), *body])
