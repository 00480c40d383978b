"""A quiet Lightning ``Trainer``: nothing written or printed that a measurement did not ask for.

Example:
    >>> sorted(QUIET)
    ['enable_checkpointing', 'enable_model_summary', 'enable_progress_bar', 'logger']
"""

from __future__ import annotations

from typing import Any

__all__ = ["QUIET"]

#: ``pl.Trainer(**QUIET, ...)``: no logger, no checkpoints, no progress bar, no model summary.
QUIET: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}
