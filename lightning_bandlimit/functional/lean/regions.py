"""Where a lean op runs inside recomputation: the modes that change what it saves there.

* :func:`keeping_spectra` (a recomputed region, :mod:`lightning_bandlimit.recompute.spectral`):
  band-limited convolutions keep their input's kept spectrum, not a recipe.
* :func:`checkpointed_region` (a checkpointed unit's forward and its recompute): an op reading one
  of the unit's inputs saves the tensor itself (:func:`held`), and a band-limited convolution
  hands its output on as a spectrum only where it is at most half the output
  (:func:`hands_spectrum_on`).

Both are per-thread modes, set by a context manager and read by the ops.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence

import torch

__all__ = [
    "checkpointed_region",
    "hands_spectrum_on",
    "held",
    "in_checkpointed_region",
    "keeping_spectra",
    "keeps_spectra",
]


# ---------------------------------------------------------------- inside a recomputed region
class _Mode(threading.local):
    def __init__(self) -> None:
        self.keep_spectra = False


_MODE = _Mode()


@contextlib.contextmanager
def keeping_spectra() -> Iterator[None]:
    """Within this block, band-limited convolutions keep their input's kept spectrum, not a recipe.

    A recipe costs no memory but a rebuild of the full input in backward. Inside a checkpointed
    region, what is saved lives only during the region's own backward, where a rebuilt input
    (and the rebuild it shares) would set the peak: the spectrum, computed in the forward
    anyway, is the smaller and faster choice there.

    Example:
        >>> with keeping_spectra():
        ...     keeps_spectra()
        True
        >>> keeps_spectra()
        False
    """
    previous, _MODE.keep_spectra = _MODE.keep_spectra, True
    try:
        yield
    finally:
        _MODE.keep_spectra = previous


def keeps_spectra() -> bool:
    """Whether :func:`keeping_spectra` is in force."""
    return _MODE.keep_spectra


# ---------------------------------------------------------------- inside a checkpointed unit
class _Region(threading.local):
    def __init__(self) -> None:
        self.depth = 0
        self.held: dict[int, tuple[weakref.ReferenceType, int]] = {}


_REGION = _Region()


@contextlib.contextmanager
def checkpointed_region(inputs: Sequence[torch.Tensor]) -> Iterator[None]:
    """Within this block (a checkpointed unit's forward and its recompute), memory-lean ops save
    what costs least *there*: the checkpoint holds ``inputs`` until the recompute anyway, so an op
    reading one saves the tensor itself, not a smaller form of it (a kept spectrum, a band
    projection), which would be a second copy; and band-limited convolutions hand their output
    on as a spectrum only where it is at most half the output (:func:`hands_spectrum_on`).

    Example:
        >>> x = torch.randn(2, 3)
        >>> with checkpointed_region([x]):
        ...     held(x), in_checkpointed_region()
        (True, True)
        >>> held(x), in_checkpointed_region()
        (False, False)
    """
    previous = _REGION.held
    _REGION.held = {**previous, **{id(t): (weakref.ref(t), t._version) for t in inputs}}
    _REGION.depth += 1
    try:
        yield
    finally:
        _REGION.depth -= 1
        _REGION.held = previous


def in_checkpointed_region() -> bool:
    """Whether :func:`checkpointed_region` is in force."""
    return _REGION.depth > 0


def hands_spectrum_on(spectrum_bytes: int, output_bytes: int) -> bool:
    """Whether a band-limited convolution hands its output to the next lean op as its kept spectrum.

    Outside a :func:`checkpointed_region`, whenever the spectrum is the smaller. Inside one, what
    is saved lives only during the unit's own backward, where the next op rebuilds the full output
    from the spectrum while the spectrum is still held: handing it on lowers memory by at most
    ``output - spectrum`` (before that rebuild) and raises it by at most ``spectrum`` (during it),
    so only a spectrum at most half the output is handed on.

    Example:
        >>> hands_spectrum_on(60, 100)
        True
        >>> with checkpointed_region([]):
        ...     hands_spectrum_on(60, 100), hands_spectrum_on(40, 100)
        (False, True)
    """
    if in_checkpointed_region():
        return 2 * spectrum_bytes <= output_bytes
    return spectrum_bytes < output_bytes


def held(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is an input of the :func:`checkpointed_region` in force (and not changed
    in place since it entered)."""
    entry = _REGION.held.get(id(tensor))
    return entry is not None and entry[0]() is tensor and entry[1] == tensor._version
