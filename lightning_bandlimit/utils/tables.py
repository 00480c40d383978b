"""One Markdown table formatter for every report and benchmark."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["markdown_table"]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (cells turned into text with ``str``).

    Args:
        header: the column titles.
        rows: one sequence of cells per row, each as long as ``header``.

    Raises:
        ValueError: if a row's length differs from the header's.

    Example:
        >>> print(markdown_table(["a", "b"], [[1, "x"]]))
        | a | b |
        |---|---|
        | 1 | x |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"markdown_table: row {i} has {len(row)} cells, expected {len(header)}")
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)
