"""Backwards that compute in the dtypes they choose, whatever autocast region they run in.

A user who calls ``loss.backward()`` inside ``torch.autocast`` runs every custom backward under
autocast too: its matmuls would be cast to bfloat16 and no longer match the float32 buffers they
write into (``out=``). The forwards already run with autocast off and pick their dtypes
explicitly; their backwards do the same.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def autocast_off(backward: F) -> F:
    """Run an ``autograd.Function.backward`` with autocast disabled on the gradients' device.

    Example:
        >>> seen = []
        >>> class Twice(torch.autograd.Function):
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         return 2 * x
        ...     @staticmethod
        ...     @autocast_off
        ...     def backward(ctx, grad):
        ...         seen.append((grad @ torch.eye(2)).dtype)  # bfloat16 without the decorator
        ...         return 2 * grad
        >>> x = torch.ones(2, 2, requires_grad=True)
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     Twice.apply(x).sum().backward()
        >>> seen
        [torch.float32]
    """

    @functools.wraps(backward)
    def wrapped(ctx: Any, *grads: Any) -> Any:
        device = next((g.device.type for g in grads if isinstance(g, torch.Tensor)), "cpu")
        with torch.autocast(device, enabled=False):
            return backward(ctx, *grads)

    return wrapped  # type: ignore[return-value]
