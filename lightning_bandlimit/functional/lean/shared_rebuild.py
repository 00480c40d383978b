"""One rebuilt tensor, shared: a fresh rebuild that another backward op will rebuild again is kept for it.

A BatchNorm output is rebuilt from the BatchNorm's input (:class:`~.sources.Affine`), and the
BatchNorm's own backward, which runs next (after the ReLU between them), rebuilds that same input
again. Inside :func:`sharing` a fresh rebuild is kept in one per-thread slot, keyed by the tensor
it was made from, and :func:`reuse` hands it over once to the next rebuild from the same tensor
(a band-limited convolution's output from its kept spectrum,
:mod:`lightning_bandlimit.functional.spectral_kernel`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

__all__ = ["reuse", "sharing"]


class _Slot(threading.local):
    def __init__(self) -> None:
        self.sharing = False
        self.key: tuple[int, int, tuple[int, ...], int] | None = None
        self.value: torch.Tensor | None = None
        # Held so that its storage cannot be freed and reused while the slot names its address.
        self.key_tensor: torch.Tensor | None = None


_SLOT = _Slot()


def _key(t: torch.Tensor) -> tuple[int, int, tuple[int, ...], int]:
    # Saved tensors come back from autograd as new objects over the same storage.
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t._version)


@contextlib.contextmanager
def sharing(enabled: bool = True) -> Iterator[None]:
    """Within this block, a fresh rebuild that another op will rebuild again is kept for it."""
    previous, _SLOT.sharing = _SLOT.sharing, enabled
    try:
        yield
    finally:
        _SLOT.sharing = previous


def reuse(key: torch.Tensor, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()``, unless the last shared rebuild was made from ``key``: then that tensor, once.

    Inside :func:`sharing` the new tensor is kept (one slot, replacing any older one) for the
    next call with the same ``key``, which takes it over and may overwrite it. Outside, the slot
    is only read. Rebuilds are deterministic, so the result is the same either way.

    Example:
        >>> spec = torch.randn(3)
        >>> with sharing():
        ...     a = reuse(spec, lambda: spec * 2)
        >>> reuse(spec, lambda: spec * 2) is a  # handed over once
        True
        >>> reuse(spec, lambda: spec * 2) is a
        False
    """
    key_ = _key(key)
    if _SLOT.key == key_ and _SLOT.value is not None:
        value, _SLOT.key, _SLOT.value, _SLOT.key_tensor = _SLOT.value, None, None, None
        return value
    value = make()
    if _SLOT.sharing:
        _SLOT.key, _SLOT.value, _SLOT.key_tensor = key_, value, key
    return value
