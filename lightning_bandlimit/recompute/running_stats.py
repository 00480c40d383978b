"""BatchNorm running statistics restored after a recompute (pytorch/pytorch#96136)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["running_stats_kept"]


@contextlib.contextmanager
def running_stats_kept(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Run a block with the running statistics of the BatchNorm layers among ``modules`` restored
    afterwards, so a recompute does not update them a second time.

    Args:
        modules: the modules to look at (e.g. ``unit.modules()``).

    Example:
        >>> bn = nn.BatchNorm1d(2)
        >>> with running_stats_kept(bn.modules()):
        ...     _ = bn(torch.randn(4, 2))
        >>> int(bn.num_batches_tracked), bn.running_mean.tolist()
        (0, [0.0, 0.0])
    """
    saved = [
        (buffer, buffer.clone())
        for m in modules
        if isinstance(m, _BatchNorm)
        for buffer in (m.running_mean, m.running_var, m.num_batches_tracked)
        if buffer is not None
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
