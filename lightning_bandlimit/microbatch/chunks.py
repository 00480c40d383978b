"""A training batch in chunks along its sample dimension (dimension 0 of its tensors).

The batch may be any collection Lightning accepts (tensors in tuples, lists, dicts, namedtuples,
dataclasses); the sample count is dimension 0 of its first tensor with a dimension, and every
tensor whose dimension 0 has that length is split with it. Other leaves (scalars, strings,
tensors of another length) go to every chunk whole.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection

__all__ = ["batch_size", "split_batch"]


def batch_size(batch: Any) -> int | None:
    """The number of samples in ``batch``: dimension 0 of its first tensor that has one;
    ``None`` when it has none.

    Example:
        >>> batch_size((torch.zeros(6, 3), torch.arange(6))), batch_size({"x": 1.0})
        (6, None)
    """
    sizes: list[int] = []
    apply_to_collection(batch, torch.Tensor, lambda t: sizes.append(t.shape[0]) if t.dim() else None)
    return sizes[0] if sizes else None


def split_batch(batch: Any, chunks: int) -> list[tuple[Any, int]]:
    """``batch`` in ``chunks`` parts of as equal sizes as can be (the first ones one larger),
    each with its number of samples; fewer parts when the batch has fewer samples.

    Args:
        batch: a collection of tensors (see the module docstring).
        chunks: the number of parts wanted (at least 1).

    Raises:
        ValueError: for ``chunks`` below 1 or a batch with no tensor to split.

    Example:
        >>> parts = split_batch((torch.arange(5), torch.zeros(5, 2), "tag"), 2)
        >>> [(x.tolist(), y.shape[0], tag, n) for (x, y, tag), n in parts]
        [([0, 1, 2], 3, 'tag', 3), ([3, 4], 2, 'tag', 2)]
    """
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be an int >= 1, got {chunks!r}")
    size = batch_size(batch)
    if size is None:
        raise ValueError(
            f"the batch has no tensor with a sample dimension to split, got {type(batch).__name__}"
        )
    count = min(chunks, size)
    bounds = [size * i // count for i in range(count + 1)]
    # sizes as equal as can be, the larger ones first (torch.tensor_split's convention)
    lengths = sorted((b - a for a, b in zip(bounds, bounds[1:])), reverse=True)
    parts = []
    start = 0
    for length in lengths:
        stop = start + length

        def take(t: torch.Tensor, start: int = start, stop: int = stop) -> torch.Tensor:
            return t[start:stop] if t.dim() and t.shape[0] == size else t

        parts.append((apply_to_collection(batch, torch.Tensor, take), length))
        start = stop
    return parts
