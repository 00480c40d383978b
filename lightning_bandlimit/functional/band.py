"""Which spectral coefficients a given compression keeps.

The FFT grid is the padded input's spatial size. Along the last axis the real FFT is one-sided
(``W // 2 + 1`` columns); the other axes are two-sided. The kept band is the low-frequency box
``|f_h| <= n_h, 0 <= f_w <= n_w``: rows ``0..n_h`` plus the mirrored last ``n_h`` rows, and
columns ``0..n_w``, i.e. a square centred on DC in the two-sided spectrum, scaled on each axis by
the same factor (Dziedzic et al. 2019, ``n = half_width * sqrt(1 - c)``).

Only finitely many boxes exist on a grid, so the requested compression is quantised to the
nearest achievable one; :attr:`SpectralBand.compression` is the rate actually applied.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from lightning_bandlimit.utils.validation import check_compression

__all__ = ["SpectralBand", "quantised_band", "spectral_band"]


@dataclass(frozen=True)
class SpectralBand:
    """The low-frequency box kept on a ``grid`` for one compression.

    Attributes:
        grid: the FFT grid (padded input spatial size), e.g. ``(34, 34)`` or ``(1, 130)``.
        half_rows: ``n_h``: the kept two-sided rows are frequencies ``-n_h..n_h``
            (all rows when ``2 * n_h + 1 >= grid[0]``).
        cols: number of kept one-sided columns (frequencies ``0..cols - 1``).
        compression: the achieved fraction of discarded one-sided coefficients.
    """

    grid: tuple[int, int]
    half_rows: int
    cols: int
    compression: float

    @property
    def rows(self) -> int:
        """Number of kept rows of the two-sided axis."""
        return _kept_rows(self.grid[0], self.half_rows)

    @property
    def is_full(self) -> bool:
        """Whether the band keeps every coefficient (no truncation)."""
        return self.rows == self.grid[0] and self.cols == self.grid[1] // 2 + 1

    @property
    def kept(self) -> int:
        """Number of kept one-sided coefficients."""
        return self.rows * self.cols


def _kept_rows(height: int, half_rows: int) -> int:
    return min(height, 2 * half_rows + 1)


def spectral_band(grid: tuple[int, int], compression: float) -> SpectralBand:
    """The band kept on ``grid`` at the given compression (quantised to the nearest box).

    Both axes scale by one factor ``t`` in ``(0, 1]``; over the finitely many boxes this yields,
    the one whose discarded fraction is nearest to ``compression`` is chosen (ties go to the
    smaller compression). ``compression=0`` always keeps every coefficient.

    Args:
        grid: ``(H, W)`` of the FFT grid; use ``(1, L)`` for one-dimensional signals.
        compression: requested fraction of one-sided coefficients to discard, in ``[0, 1)``.

    Raises:
        TypeError: if ``compression`` is not a real number
            (:func:`~lightning_bandlimit.utils.validation.check_compression`) or ``grid`` is not
            a pair of ints.
        ValueError: if ``compression`` is outside ``[0, 1)`` or a ``grid`` size is below 1.

    Example:
        >>> band = spectral_band((34, 34), 0.5)
        >>> band.rows, band.cols, round(band.compression, 3)
        (25, 13, 0.469)
        >>> spectral_band((34, 34), 0.0).is_full
        True
    """
    compression = check_compression(compression)
    if (
        not isinstance(grid, (tuple, list))
        or len(grid) != 2
        or any(isinstance(n, bool) or not isinstance(n, int) for n in grid)
    ):
        raise TypeError(f"grid must be two positive integers (H, W), got {grid!r}")
    if min(grid) < 1:
        raise ValueError(f"grid must be two positive integers (H, W), got {grid!r}")
    # Validated first: the cache would treat False like 0.0.
    return quantised_band((int(grid[0]), int(grid[1])), compression)


@functools.lru_cache(maxsize=4096)
def quantised_band(grid: tuple[int, int], compression: float) -> SpectralBand:
    """:func:`spectral_band` for arguments validated already (a tuple grid, a float compression).

    The internal entry: a convolution resolves its band once per forward pass with it, from a
    compression its public caller checked.
    """
    height, width = grid
    max_half_rows = height // 2
    max_cols = width // 2 + 1
    total = height * max_cols
    if compression == 0.0:
        return SpectralBand(grid, max_half_rows, max_cols, 0.0)

    # Every box reachable by a common scale t: the breakpoints of both axes.
    scales = {1.0}
    scales.update(i / max_half_rows for i in range(max_half_rows + 1) if max_half_rows)
    scales.update(j / (max_cols - 1) for j in range(max_cols) if max_cols > 1)
    best: SpectralBand | None = None
    for t in sorted(scales, reverse=True):
        half_rows = math.ceil(t * max_half_rows - 1e-9)
        cols = max(1, math.ceil(t * (max_cols - 1) - 1e-9) + 1)
        achieved = 1.0 - _kept_rows(height, half_rows) * cols / total
        if best is None or abs(achieved - compression) < abs(best.compression - compression) - 1e-12:
            best = SpectralBand(grid, half_rows, cols, achieved)
    assert best is not None
    return best
