"""Figures without a display: matplotlib's pyplot on the Agg backend, imported only when a script draws.

Example:
    >>> plt = pyplot()
    >>> plt.get_backend().lower()
    'agg'
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["pyplot"]


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` with the Agg backend (files only, no window; safe on a headless machine)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
