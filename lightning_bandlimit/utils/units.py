"""Byte units, so that a figure's unit is named where it is printed or compared.

Example:
    >>> from lightning_bandlimit.utils.units import MIB
    >>> f"{3 * MIB / MIB:.0f} MiB"
    '3 MiB'
"""

from __future__ import annotations

__all__ = ["GIB", "MIB"]

MIB = 2**20  # bytes in a mebibyte
GIB = 2**30  # bytes in a gibibyte
