"""The switch: a module (or a plain chain's segment) checkpointed and back, in place, between steps.

:func:`checkpoint` changes the class of a module object to a checkpointed subclass of its own
class (made once per class); :func:`uncheckpoint` is the exact inverse. See
:mod:`lightning_bandlimit.recompute` for what runs while a unit is checkpointed.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch
from torch import nn

from lightning_bandlimit.recompute.arguments import checkpoint_call
from lightning_bandlimit.recompute.pointwise import pointwise_contexts
from lightning_bandlimit.recompute.running_stats import running_stats_kept
from lightning_bandlimit.recompute.segments import Segment
from lightning_bandlimit.recompute.spectral import checkpoint_from_spectrum
from lightning_bandlimit.recompute.units import Unit

__all__ = ["FULL", "MODES", "POINTWISE", "checkpoint", "checkpoint_mode", "is_checkpointed", "uncheckpoint"]

FULL = "full"
POINTWISE = "pointwise"
#: the modes of a checkpointed unit, least memory last
MODES = (POINTWISE, FULL)


class _Checkpointed:
    """Mixin of the checkpointed subclasses; its ``forward`` wraps the base class's."""

    _base_class: type[nn.Module]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        base_forward = super().forward  # type: ignore[misc]
        if not (self.training and torch.is_grad_enabled()):  # type: ignore[attr-defined]
            return base_forward(*args, **kwargs)
        kept = lambda: running_stats_kept(self.modules())  # type: ignore[attr-defined]  # noqa: E731
        name = _NAMES.get(self, type(self)._base_class.__name__)  # type: ignore[arg-type]
        if _MODES.get(self) == POINTWISE:  # type: ignore[call-overload]
            return checkpoint_call(base_forward, args, kwargs, lambda: pointwise_contexts(kept), name, True)
        context_fn = lambda: (contextlib.nullcontext(), kept())  # noqa: E731
        kept_spectrum, out = checkpoint_from_spectrum(self, args, kwargs, context_fn)  # type: ignore[arg-type]
        if kept_spectrum:
            return out
        return checkpoint_call(base_forward, args, kwargs, context_fn, name)


_NAMES: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
_MODES: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
_SUBCLASSES: dict[type[nn.Module], type[nn.Module]] = {}


def _checkpointed_class(cls: type[nn.Module]) -> type[nn.Module]:
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        namespace = {"_base_class": cls, "_unchecked_forward": cls.forward}
        sub = type(f"Checkpointed{cls.__name__}", (_Checkpointed, cls), namespace)
        sub.__module__ = cls.__module__
        _SUBCLASSES[cls] = sub
    return sub


def is_checkpointed(module: Unit) -> bool:
    """Whether ``module`` runs checkpointed (see :func:`checkpoint`).

    Example:
        >>> block = nn.Sequential(nn.Conv2d(1, 1, 3), nn.ReLU())
        >>> is_checkpointed(checkpoint(block)), is_checkpointed(uncheckpoint(block))
        (True, False)
    """
    if isinstance(module, Segment):
        return module.is_checkpointed()
    return isinstance(module, _Checkpointed)


def checkpoint_mode(module: Unit) -> str | None:
    """How ``module`` runs checkpointed: :data:`FULL`, :data:`POINTWISE`, or ``None`` (not
    checkpointed).

    Example:
        >>> block = nn.Sequential(nn.Conv2d(1, 1, 3), nn.ReLU())
        >>> checkpoint_mode(checkpoint(block, mode=POINTWISE)), checkpoint_mode(uncheckpoint(block))
        ('pointwise', None)
    """
    if isinstance(module, Segment):
        return module.mode if module.is_checkpointed() else None
    if not isinstance(module, _Checkpointed):
        return None
    return _MODES.get(module, FULL)


def checkpoint(module: Unit, name: str | None = None, mode: str = FULL) -> Unit:
    """Checkpoint ``module``'s activations from its next training forward on (in place).

    In the :data:`FULL` mode only the module's input is kept and its whole forward runs again in
    backward; in the :data:`POINTWISE` mode the outputs of its convolutions and matrix products
    are kept too and only the ops between them run again
    (:mod:`lightning_bandlimit.recompute.pointwise`).

    Container arguments (a list of feature maps, as DenseNet passes them) are frozen at call
    time: a caller that changes them afterwards cannot change the recompute
    (:mod:`lightning_bandlimit.recompute.arguments`).

    Args:
        module: any module, or a :class:`~lightning_bandlimit.recompute.segments.Segment` of a
            plain chain; already checkpointed ones are left as they are.
        name: the unit's name in error messages (default: its class name).
        mode: :data:`FULL` (default) or :data:`POINTWISE`; a checkpointed module changes mode.

    Returns:
        ``module`` (the same object, its class changed to a checkpointed subclass).

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``.
        ValueError: for an unknown ``mode``.

    Example:
        >>> block = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU())
        >>> keys = list(block.state_dict())
        >>> type(checkpoint(block)).__name__, list(block.state_dict()) == keys
        ('CheckpointedSequential', True)
        >>> block(torch.rand(4, 2, 8, 8, requires_grad=True)).sum().backward()
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if isinstance(module, Segment):
        module.checkpoint(mode)
        return module
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module or a Segment, got {type(module).__name__}")
    if name is not None:
        _NAMES[module] = name
    if not is_checkpointed(module):
        module.__class__ = _checkpointed_class(type(module))
    _MODES[module] = mode
    return module


def uncheckpoint(module: Unit) -> Unit:
    """Exact inverse of :func:`checkpoint`: ``module`` is of its own class again (in place).

    Args:
        module: a module; ones that are not checkpointed are left as they are.

    Returns:
        ``module``.

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``.

    Example:
        >>> conv = nn.Conv2d(1, 1, 3)
        >>> type(uncheckpoint(checkpoint(conv))) is nn.Conv2d
        True
    """
    if isinstance(module, Segment):
        module.uncheckpoint()
        return module
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module or a Segment, got {type(module).__name__}")
    if is_checkpointed(module):
        module.__class__ = module._base_class  # type: ignore[attr-defined]
        _MODES.pop(module, None)
    return module
