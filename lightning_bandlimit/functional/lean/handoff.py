"""The hand-off of recipes: the op that makes an activation publishes one, the op that saves it looks it up.

The producing op :func:`publish`-es a :class:`~.sources.Source` for the tensor it returns; the
next op that would save that tensor looks it up with :func:`lookup` and saves the source's
tensors instead (through ``ctx.save_for_backward``, so saved-tensor hooks,
``torch.utils.checkpoint`` and :class:`~lightning_bandlimit.SavedTensorMeter` see them). An entry
is valid only for the same tensor object at the same version (an in-place change such as
``out += identity`` invalidates it), and only under the same saved-tensor hooks it was published
under: inside a ``torch.utils.checkpoint`` region the recomputation sees no entry for the region's
input, so the original forward must not use one either. Entries disappear with their tensor; the
registry is per thread.

Whether any recipe can exist at all: band-limited layers :func:`engage` (and :func:`disengage`)
themselves, and :func:`quiet` tells the memory-lean modules that no activation can descend from a
band-limited op, so they run their plain twin's forward without looking at the input.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lightning_bandlimit.functional.lean.sources import Saved, Source

__all__ = ["disengage", "engage", "lookup", "publish", "published_any", "quiet"]


@dataclass
class _Entry:
    ref: weakref.ReferenceType
    version: int
    hooks: object
    source: Source
    tensors: tuple[torch.Tensor, ...]


class _Registry(threading.local):
    def __init__(self) -> None:
        self.entries: dict[int, _Entry] = {}


_REGISTRY = _Registry()
# A bound on live entries, in case tensors that were published stay alive for long (a model that
# returns its activations): the oldest are dropped, which only costs the saving they offered.
_MAX_ENTRIES = 256


def _hooks() -> object:
    """Identity of the innermost saved-tensor hooks (``None`` without any)."""
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return None if top is None else top[0]


def publish(tensor: torch.Tensor, source: Source, tensors: Sequence[torch.Tensor]) -> None:
    """Offer ``source`` (reading ``tensors``) as a recipe for ``tensor`` to the op that consumes it.

    ``publish(t, Saved(), ())`` marks ``t`` as an activation with no smaller form, to be kept as
    itself (the registry does not hold ``t``; :func:`lookup` returns it as the tensor to keep).

    Example:
        >>> y = torch.randn(4, 2, requires_grad=True) * 1.0
        >>> publish(y, Saved(), (y,))
        >>> lookup(y)[0]
        Saved()
        >>> _ = y.add_(1)  # an in-place change: the recipe no longer describes y
        >>> lookup(y) is None
        True
    """
    entries = _REGISTRY.entries
    key = id(tensor)

    def forget(_: weakref.ReferenceType, key: int = key) -> None:
        if entries.get(key) is entry:
            del entries[key]

    entry = _Entry(weakref.ref(tensor, forget), tensor._version, _hooks(), source, tuple(tensors))
    entries.pop(key, None)
    entries[key] = entry
    while len(entries) > _MAX_ENTRIES:
        del entries[next(iter(entries))]


def lookup(tensor: torch.Tensor) -> tuple[Source, tuple[torch.Tensor, ...]] | None:
    """The recipe published for ``tensor`` and the tensors it reads, or ``None``.

    Valid only for the same tensor object at the same version under the same saved-tensor hooks
    (see the module docstring).
    """
    entry = _REGISTRY.entries.get(id(tensor))
    if (
        entry is None
        or entry.ref() is not tensor
        or entry.version != tensor._version
        or entry.hooks is not _hooks()
    ):
        return None
    if not entry.tensors and isinstance(entry.source, Saved):
        return entry.source, (tensor,)
    return entry.source, entry.tensors


def published_any() -> bool:
    """Whether any recipe is published in this thread: ``False`` means :func:`lookup` returns
    ``None`` for every tensor (one dictionary read; a full-band layer's per-call test)."""
    return bool(_REGISTRY.entries)


# ---------------------------------------------------------------- whether any recipe can exist
class _Engaged:
    """Who may have produced a band-limited activation that is still alive (see :func:`quiet`)."""

    def __init__(self) -> None:
        # Layers that ran a band-limited op since they last were set to their full-band fast path.
        self.layers: weakref.WeakSet[object] = weakref.WeakSet()
        # A functional band-limited convolution ran while autograd recorded it, without publishing.
        self.functional = False


_ENGAGED = _Engaged()


def engage(layer: object | None = None) -> None:
    """Record that ``layer`` runs a band-limited op (``None``: a functional call, for good).

    Called by a band-limited layer whenever it does not take its full-band fast path, and by
    the public functional convolutions when they run a band-limited op that publishes nothing.
    """
    if layer is None:
        _ENGAGED.functional = True
    else:
        _ENGAGED.layers.add(layer)


def disengage(layer: object) -> None:
    """Record that ``layer`` runs the plain convolution from now on (its setters, its swap back)."""
    _ENGAGED.layers.discard(layer)


def quiet() -> bool:
    """Whether no activation can descend from a band-limited op: no band-limited layer is engaged
    (every one sits at its full band, e.g. ``compression=0``, or is gone), no functional
    band-limited convolution ran unpublished, and no recipe is published in this thread.

    The memory-lean modules run their plain twin's forward then without looking at the input.
    Process-wide: a model at ``compression > 0`` beside one at 0 makes neither quiet. A layer set
    back to its full band while its band-limited outputs are still alive no longer counts; what
    follows those outputs then keeps what the plain modules keep (the same results).

    Example:
        >>> y = torch.randn(2, 3, requires_grad=True) * 1.0
        >>> publish(y, Saved(), ())  # a recipe exists while y lives
        >>> quiet(), published_any()
        (False, True)
    """
    return not (_ENGAGED.layers or _ENGAGED.functional or _REGISTRY.entries)
