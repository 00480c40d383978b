"""Gradient statistics for AdaScale, measured inside DDP's all-reduce.

A DDP communication hook sees each bucket of this rank's *local* gradient before it is averaged
and the averaged (global) gradient after. Summing ``|local|^2`` and ``|global|^2`` over the
buckets gives the two squared norms from which :func:`gradient_noise_statistics` estimates the
gradient variance and squared mean (McCandlish et al. 2018) at no extra backward pass.
"""

import math
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn

from lightning_bandlimit.strategies.scaling import adascale_gain, gradient_noise_statistics

__all__ = ["AdaScaleGain", "GradientNormState", "gradient_norm_hook", "update_noise"]


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


def update_noise(noise: dict[str, float], trace: float, mu2: float, smoothing: float) -> None:
    """Fold one measurement into AdaScale's running statistics (an exponential moving average).

    Args:
        noise: the running ``{"trace": tr(Sigma), "mu2": |G|^2}``, updated in place (empty at first).
        trace: this step's ``tr(Sigma)`` estimate.
        mu2: this step's ``|G|^2`` estimate.
        smoothing: the weight of the new measurement, in ``(0, 1]``.

    Example:
        >>> noise = {}
        >>> update_noise(noise, 4.0, 1.0, 0.5); update_noise(noise, 2.0, 3.0, 0.5)
        >>> noise
        {'trace': 3.0, 'mu2': 2.0}
    """
    for key, value in (("trace", trace), ("mu2", mu2)):
        old = noise.get(key)
        noise[key] = value if old is None else (1 - smoothing) * old + smoothing * value


class AdaScaleGain:
    """AdaScale's running gradient statistics and the LR gain they give at a batch scale.

    Attributes:
        noise: the running ``{"trace": tr(Sigma), "mu2": |G|^2}`` (empty until measured).
        gain: the last gain from :meth:`update` (1 at first).

    Example:
        >>> tracker = AdaScaleGain()
        >>> tracker.observe(local_sq=5.0, global_sq=2.0, scale=4, batch=1, smoothing=1.0)
        >>> tracker.noise, tracker.update(scale=4.0, reference_batch=1)
        ({'trace': 4.0, 'mu2': 1.0}, 2.5)
    """

    def __init__(self, noise: dict[str, float] | None = None) -> None:
        self.noise: dict[str, float] = dict(noise or {})
        self.gain = 1.0
        self._warned = False

    def observe(self, local_sq: float, global_sq: float, scale: int, batch: int, smoothing: float) -> None:
        """Fold one step's squared gradient norms into :attr:`noise`.

        Args:
            local_sq: the mean over ranks of ``|g_local|^2``.
            global_sq: ``|g|^2`` of the all-reduced gradient.
            scale: the number of gradients averaged (ranks).
            batch: samples behind one rank's gradient (per-device batch x accumulation).
            smoothing: the weight of this measurement, in ``(0, 1]``.
        """
        sigma2, mu2 = gradient_noise_statistics(local_sq, global_sq, scale)
        update_noise(self.noise, sigma2 * batch, mu2, smoothing)

    def update(self, scale: float, reference_batch: int) -> float:
        """The gain at ``scale`` (global batch / ``reference_batch``), kept in :attr:`gain`.

        1 at the reference scale, and (with one warning) while there are no statistics yet.
        """
        if math.isclose(scale, 1.0):
            self.gain = 1.0
        elif "trace" not in self.noise:
            if not self._warned:
                self._warned = True
                rank_zero_warn(
                    "ElasticDDPStrategy: AdaScale has no gradient statistics yet (they need 2+ processes); "
                    f"training at scale {scale:g} with gain 1 until it has"
                )
            self.gain = 1.0
        else:
            self.gain = adascale_gain(self.noise["trace"] / reference_batch, self.noise["mu2"], scale)
        return self.gain
