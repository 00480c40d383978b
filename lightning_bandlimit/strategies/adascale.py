"""Gradient statistics for AdaScale, measured inside DDP's all-reduce.

A DDP communication hook sees each bucket of this rank's *local* gradient before it is averaged
and the averaged (global) gradient after. Summing ``|local|^2`` and ``|global|^2`` over the
buckets gives the two squared norms from which :func:`gradient_noise_statistics` estimates the
gradient variance and squared mean (McCandlish et al. 2018) at no extra backward pass.
"""

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GradientNormState", "gradient_norm_hook"]


class GradientNormState:
    """Squared norms gathered by :func:`gradient_norm_hook` during one backward.

    Attributes:
        local_sq: ``|g_local|^2`` of this rank's gradient (summed over buckets).
        global_sq: ``|g|^2`` of the all-reduced mean gradient.
        process_group: the group to all-reduce in (``None``: the default group).
    """

    def __init__(self, process_group: Any = None) -> None:
        self.process_group = process_group
        self.local_sq = torch.zeros((), dtype=torch.float64)
        self.global_sq = torch.zeros((), dtype=torch.float64)
        self.buckets = 0

    def reset(self) -> None:
        """Forget the last backward's norms."""
        self.local_sq = torch.zeros((), dtype=torch.float64)
        self.global_sq = torch.zeros((), dtype=torch.float64)
        self.buckets = 0


def gradient_norm_hook(
    state: GradientNormState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """All-reduce (mean) a gradient bucket like DDP's default hook, recording both squared norms.

    Register with ``ddp_model.register_comm_hook(GradientNormState(), gradient_norm_hook)``.
    """
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buffer = bucket.buffer()
    state.local_sq = state.local_sq + buffer.detach().double().pow(2).sum().cpu()
    state.buckets += 1
    buffer.div_(world)
    future = dist.all_reduce(buffer, group=group, async_op=True).get_future()

    def record_global(fut: torch.futures.Future[Any]) -> torch.Tensor:
        reduced = fut.value()[0]
        state.global_sq = state.global_sq + reduced.detach().double().pow(2).sum().cpu()
        return reduced

    return future.then(record_global)
