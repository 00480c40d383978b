"""Exact, compact descriptions of activations, handed from the op that makes one to the op that saves it.

Autograd keeps, per op, the tensors its backward needs. In a conv -> BatchNorm -> ReLU -> conv
chain most of them are recomputable exactly from something smaller that is kept anyway: a
band-limited convolution's output from its kept spectrum, a BatchNorm output from its input and
two per-channel vectors, a ReLU output from the BatchNorm output it was computed from. A
:class:`Source` is such a recipe: a frozen description plus the tensors it reads, and
:meth:`Source.rebuild` recomputes the activation: with the very same operations the forward pass
used (a convolution's output from its spectrum, bit for bit on a deterministic backend), or with
the same formula in another kernel (a BatchNorm output, equal to round-off; what must be exact,
the ReLU mask, is kept from the forward pass itself).

Hand-off: the producing op :func:`publish`-es a source for the tensor it returns; the next op that
would save that tensor looks it up with :func:`lookup` and saves the source's tensors instead
(through ``ctx.save_for_backward``, so saved-tensor hooks, ``torch.utils.checkpoint`` and
:class:`~lightning_bandlimit.SavedTensorMeter` see them). An entry is valid only for the same tensor
object at the same version (an in-place change such as ``out += identity`` invalidates it), and
only under the same saved-tensor hooks it was published under: inside a
``torch.utils.checkpoint`` region the recomputation sees no entry for the region's input, so the
original forward must not use one either. Entries disappear with their tensor.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "Affine",
    "Relu",
    "Saved",
    "Source",
    "affine",
    "checkpointed_region",
    "hands_spectrum_on",
    "held",
    "in_checkpointed_region",
    "keeping_spectra",
    "keeps_spectra",
    "lookup",
    "publish",
]
__all__ += ["disengage", "engage", "published_any", "quiet", "rebuild", "reuse", "sharing"]


class Source:
    """Recipe for recomputing one activation exactly from the tensors it lists.

    Subclasses are frozen dataclasses holding only static information; the tensors travel
    beside them (``tensors`` at publication, ``ctx.saved_tensors`` in the backward pass), in the
    order :meth:`rebuild` consumes them.
    """

    #: whether :meth:`rebuild` returns a new tensor (``False``: one of the saved tensors itself)
    fresh: bool = True

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        """Recompute the activation, taking its tensors from ``tensors`` in order."""
        raise NotImplementedError


@dataclass(frozen=True)
class Saved(Source):
    """The activation is kept as itself."""

    fresh = False

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        return next(tensors)


def affine(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(x * scale + shift)`` per channel (dim 1), computed in ``scale``'s dtype, returned in ``dtype``.

    How a BatchNorm output in training mode is recomputed from its input.

    Example:
        >>> x = torch.ones(2, 3, 4)
        >>> affine(x, torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3), torch.float32)[0, :, 0]
        tensor([1., 2., 3.])
    """
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return torch.addcmul(shift.view(shape), x.to(scale.dtype), scale.view(shape)).to(dtype)


@dataclass(frozen=True)
class Affine(Source):
    """``affine(source, scale, shift, dtype)``: a BatchNorm output in training mode."""

    source: Source
    dtype: torch.dtype

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        # The BatchNorm that produced this output rebuilds the same input next in the backward
        # pass (after the ReLU between them): a fresh input is left for it (:func:`reuse`).
        with sharing(self.source.fresh):
            x = self.source.rebuild(tensors)
        scale, shift = next(tensors), next(tensors)
        return affine(x, scale, shift, self.dtype)


@dataclass(frozen=True)
class Relu(Source):
    """``relu(source)``."""

    source: Source

    def rebuild(self, tensors: Iterator[torch.Tensor]) -> torch.Tensor:
        x = self.source.rebuild(tensors)
        return x.relu_() if self.source.fresh else x.relu()


def rebuild(source: Source, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Recompute the activation ``source`` describes from exactly ``tensors``.

    Raises:
        ValueError: if ``tensors`` are more or fewer than the source reads.

    Example:
        >>> y = torch.randn(2, 3, 4)
        >>> scale, shift = torch.rand(3), torch.rand(3)
        >>> z = affine(y, scale, shift, y.dtype)
        >>> torch.equal(rebuild(Relu(Affine(Saved(), y.dtype)), [y, scale, shift]), z.relu())
        True
    """
    it = iter(tensors)
    out = source.rebuild(it)
    if next(it, None) is not None:
        raise ValueError(f"{type(source).__name__} was given more tensors than it reads")
    return out


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


# ---------------------------------------------------------------- one rebuilt tensor, shared
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
