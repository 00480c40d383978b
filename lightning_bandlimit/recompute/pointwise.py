"""The pointwise mode of a checkpointed unit: keep what the heavy ops return, recompute the rest.

A unit checkpointed in full keeps only its input and recomputes its whole forward in backward,
convolutions included. In the pointwise mode it keeps the outputs of its heavy ops (the ops in
:data:`SAVED_OPS`: convolutions and matrix products) and recomputes only the cheap ops between
them (BatchNorm, activations, residual sums, concatenations), through PyTorch's selective
activation checkpointing (``torch.utils.checkpoint.create_selective_checkpoint_contexts`` with a
per-op policy, :func:`pointwise_policy`). What it frees is what those cheap ops saved (a ReLU's
output, a DenseNet layer's concatenated input); what it costs is their forward once more, a few
per cent of a step where a unit's recompute costs its convolutions too. Gradients are exact:
the same ops run on the same values.

Which ops are heavy is per-op knowledge kept as data (:data:`SAVED_OPS`), beside the one
mechanism (:func:`pointwise_contexts`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["LAYER_TYPES", "SAVED_OPS", "SAVED_OP_NAMES", "pointwise_contexts", "pointwise_policy"]

#: ATen ops whose outputs a pointwise-checkpointed unit keeps (the rest is recomputed)
SAVED_OP_NAMES: tuple[str, ...] = (
    "convolution",
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
)
SAVED_OPS: frozenset[Any] = frozenset(
    getattr(torch.ops.aten, name).default for name in SAVED_OP_NAMES if hasattr(torch.ops.aten, name)
)

#: modules whose forward is one of :data:`SAVED_OPS` (their outputs are what the mode keeps)
LAYER_TYPES: tuple[type[torch.nn.Module], ...] = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.Linear,
)


def pointwise_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """The selective checkpointing policy of the pointwise mode: keep the outputs of
    :data:`SAVED_OPS` (but of convolutions over 1 x 1 maps), recompute every other op.

    Example:
        >>> pointwise_policy(None, torch.ops.aten.convolution.default, torch.zeros(1, 2, 8, 8))
        <CheckpointPolicy.MUST_SAVE: 0>
        >>> pointwise_policy(None, torch.ops.aten.convolution.default, torch.zeros(1, 2, 1, 1))
        <CheckpointPolicy.PREFER_RECOMPUTE: 3>
        >>> pointwise_policy(None, torch.ops.aten.relu.default)
        <CheckpointPolicy.PREFER_RECOMPUTE: 3>
    """
    if op not in SAVED_OPS or (op is _CONVOLUTION and args and _pooled(args[0])):
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


_CONVOLUTION = torch.ops.aten.convolution.default


def _pooled(input: Any) -> bool:
    """A convolution over 1 x 1 maps (a squeeze-excitation's): its output is tiny and cheap to
    recompute, and often changed in place by the activation after it (which a kept output
    must not be)."""
    return isinstance(input, torch.Tensor) and input.dim() > 2 and all(size == 1 for size in input.shape[2:])


def pointwise_contexts(recompute: Callable[[], contextlib.AbstractContextManager[Any]]) -> tuple[Any, Any]:
    """The ``context_fn`` pair of a pointwise checkpoint: the selective policy's forward and
    recompute contexts, with ``recompute()`` (e.g. BatchNorm's running statistics kept) entered
    around the recompute too.

    Args:
        recompute: makes the extra context of the recompute.

    Example:
        >>> from torch import nn
        >>> block = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU())
        >>> x = torch.randn(4, 2, 6, 6, requires_grad=True)
        >>> out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False,
        ...     context_fn=lambda: pointwise_contexts(contextlib.nullcontext))
        >>> out.sum().backward()
    """
    forward, recomputing = create_selective_checkpoint_contexts(pointwise_policy)
    return forward, _both(recomputing, recompute)


@contextlib.contextmanager
def _both(first: Any, second: Callable[[], contextlib.AbstractContextManager[Any]]) -> Iterator[None]:
    with second(), first:
        yield


@functools.cache
def respects_hooks_argument() -> bool:
    """Whether ``torch.utils.checkpoint.checkpoint`` takes ``respect_saved_tensors_hooks`` (what
    a selective checkpoint saves then goes through the saved-tensor hooks, so meters see it)."""
    import inspect

    return "respect_saved_tensors_hooks" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters
