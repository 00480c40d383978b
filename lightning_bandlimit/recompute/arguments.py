"""A checkpointed call whose container arguments cannot change under its recompute.

``torch.utils.checkpoint`` keeps non-tensor arguments by reference: a caller that appends to a
list after the call (torchvision's ``_DenseBlock`` does, to the list of features it hands each
``_DenseLayer``) changes what the recompute sees, and the recompute then differs from the
forward (vision #2221: wrong statistics, a ``CheckpointError``, or a native kernel fed wrong
shapes). Here the arguments are flattened into their tensors at call time (``torch.utils._pytree``:
lists, tuples, dicts, named tuples) and rebuilt inside the recompute from those tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch.utils import _pytree as pytree

from lightning_bandlimit.functional.lean.regions import checkpointed_region
from lightning_bandlimit.recompute.pointwise import respects_hooks_argument

__all__ = ["RecomputeMismatch", "checkpoint_call"]

_STOP = getattr(torch.utils.checkpoint, "_StopRecomputationError", ())


class RecomputeMismatch(RuntimeError):
    """A unit's recompute differed from its forward (see :func:`checkpoint_call`)."""


def checkpoint_call(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    context_fn: Callable[[], tuple[Any, Any]],
    name: str,
    selective: bool = False,
) -> Any:
    """``torch.utils.checkpoint.checkpoint(function, *args, **kwargs)`` (non-reentrant), with the
    containers among the arguments frozen at call time.

    Args:
        function: what to run, and run again in backward.
        args: positional arguments; lists, tuples and dicts of tensors are flattened.
        kwargs: keyword arguments, likewise.
        context_fn: as ``torch.utils.checkpoint.checkpoint``'s.
        name: the unit's name, for the error raised when the recompute fails.
        selective: ``context_fn`` is a selective checkpoint's: what it saves goes through the
            saved-tensor hooks active around the call (as any saved tensor), where torch can.

    Raises:
        RecomputeMismatch: in backward, when the recompute raises (it ran on the same tensors as
            the forward, so it is the unit that differs); the original error is its cause.

    Example:
        >>> conv = torch.nn.Conv2d(1, 1, 3)
        >>> features = [torch.rand(2, 1, 5, 5, requires_grad=True)]
        >>> out = checkpoint_call(lambda xs: conv(torch.cat(xs, 1)), (features,), {},
        ...     torch.utils.checkpoint.noop_context_fn, "conv")
        >>> features.append(torch.rand(2, 1, 5, 5))  # the caller's list changes afterwards
        >>> out.sum().backward()  # the recompute still sees one tensor
    """
    leaves, spec = pytree.tree_flatten((args, kwargs))
    places = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    fixed = list(leaves)  # a copy: the caller's containers are no longer read
    recomputing = [False]

    def run(*tensors: torch.Tensor) -> Any:
        values = list(fixed)
        for i, tensor in zip(places, tensors):
            values[i] = tensor
        call_args, call_kwargs = pytree.tree_unflatten(values, spec)
        with checkpointed_region(tensors):
            if not recomputing[0]:
                recomputing[0] = True
                return function(*call_args, **call_kwargs)
            try:
                return function(*call_args, **call_kwargs)
            except _STOP:  # torch's own signal that the recompute has rebuilt what backward needs
                raise
            except Exception as error:
                raise RecomputeMismatch(
                    f"the recompute of checkpointed unit {name!r} failed where its forward ran "
                    f"({type(error).__name__}: {error})"
                ) from error

    extra = {"respect_saved_tensors_hooks": True} if selective and respects_hooks_argument() else {}
    return torch.utils.checkpoint.checkpoint(
        run, *(leaves[i] for i in places), use_reentrant=False, context_fn=context_fn, **extra
    )
