"""Why the ladder moved (or did not): each decision's reason, and the number it is logged as."""

from __future__ import annotations

__all__ = ["HOLD", "LOWER", "OOM", "RAISE", "REASON_CODES"]

HOLD, RAISE, LOWER, OOM = "hold", "raise", "lower", "oom"

REASON_CODES: dict[str, float] = {LOWER: -1.0, HOLD: 0.0, RAISE: 1.0, OOM: 2.0}
"""The logged ``decision`` value of each reason (``lower`` -1, ``hold`` 0, ``raise`` 1, ``oom`` 2).

Example:
    >>> REASON_CODES[RAISE], REASON_CODES[OOM]
    (1.0, 2.0)
"""
