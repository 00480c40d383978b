"""AdaScale (Johnson et al. 2020): the rule, and the gradient statistics it measures its LR gain from.

:class:`AdaScale` keeps the reference hyperparameters at any world size and asks the strategy, via
its :class:`AdaScaleTracker` (:meth:`AdaScale.gain_tracker`), to multiply each step's LR by the gain
``r = (sigma2 + mu2) / (sigma2 / S + mu2)`` (:func:`adascale_gain`).

The statistics are measured inside DDP's all-reduce: a DDP communication hook sees each bucket
of this rank's *local* gradient before it is averaged and the averaged (global) gradient after.
Summing ``|local|^2`` and ``|global|^2`` over the buckets gives the two squared norms from which
:func:`gradient_noise_statistics` estimates the gradient variance and squared mean (McCandlish et
al. 2018) at no extra backward pass.
"""

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn

from lightning_bandlimit.strategies.rules import NoScaling
from lightning_bandlimit.strategies.scaling_rule import GainTracker
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = [
    "AdaScale",
    "AdaScaleGain",
    "AdaScaleTracker",
    "GradientNormState",
    "adascale_gain",
    "gradient_noise_statistics",
    "gradient_norm_hook",
    "update_noise",
]


class AdaScale(NoScaling):
    """AdaScale (Johnson et al. 2020): the LR gain is measured while training, not fixed.

    :meth:`adjust` returns the reference hyperparameters at the new world size (LR, momentum and
    betas unchanged); :class:`~lightning_bandlimit.strategies.ElasticDDPStrategy` then, at every
    optimizer step, multiplies the scheduled LR by the gain ``r`` for the scale
    ``S = global batch / reference global batch`` (``r`` in ``[1, S]`` when ``S >= 1``, in
    ``[S, 1]`` when ``S < 1``) and advances a :class:`~lightning_bandlimit.strategies.SampleSchedule`
    by ``r`` reference batches, so the schedule ends after the same amount of *progress* at any
    scale. The gradient variance is estimated from the ranks' local gradients against the
    all-reduced one (a DDP communication hook); with a single process the last estimate saved in
    the checkpoint is used.

    Args:
        smoothing: weight of the newest estimate in the running averages of the gradient
            variance and squared mean, in ``(0, 1]``.

    Example:
        >>> from lightning_bandlimit.strategies import TrainingConfig
        >>> ref = TrainingConfig(world_size=1, per_device_batch=32, lr=0.1, momentum=0.9)
        >>> new = AdaScale().adjust(ref, world_size=4)
        >>> new.lr, new.global_batch
        (0.1, 128)
    """

    name = "adascale"

    def __init__(self, smoothing: float = 0.1) -> None:
        self.smoothing = check_real("smoothing", smoothing, minimum=0.0, maximum=1.0, min_open=True)

    def gain_tracker(self) -> "AdaScaleTracker":
        """A tracker that measures the gain from the ranks' gradients (see the class docstring)."""
        return AdaScaleTracker(self.smoothing)


def gradient_noise_statistics(local_sq_norm: float, global_sq_norm: float, scale: int) -> tuple[float, float]:
    """Unbiased ``(sigma2, mu2)`` from gradient norms at two batch sizes (McCandlish et al. 2018).

    ``local_sq_norm`` is the mean over ranks of ``|g_local|^2`` (batch b each), ``global_sq_norm``
    is ``|g|^2`` of the all-reduced gradient (batch S b). With ``E|g_B|^2 = |G|^2 + tr(Sigma) / B``:
    ``mu2 = |G|^2`` and ``sigma2 = tr(Sigma) / b``, the variance of one rank's gradient. The
    gradient noise scale is ``B_simple = b * sigma2 / mu2``.

    Args:
        local_sq_norm: mean squared norm of the per-rank gradients.
        global_sq_norm: squared norm of their mean.
        scale: number of gradients averaged (ranks x micro-batches), at least 2.

    Raises:
        ValueError: if ``scale < 2``.

    Example:
        >>> gradient_noise_statistics(local_sq_norm=5.0, global_sq_norm=2.0, scale=4)
        (4.0, 1.0)
    """
    check_int("scale", scale, minimum=2)
    mu2 = (scale * global_sq_norm - local_sq_norm) / (scale - 1)
    sigma2 = (local_sq_norm - global_sq_norm) * scale / (scale - 1)
    return sigma2, mu2


def adascale_gain(sigma2: float, mu2: float, scale: float) -> float:
    """AdaScale's gain ``r = (sigma2 + mu2) / (sigma2 / S + mu2)``, clipped between 1 and ``S``.

    ``sigma2`` is the gradient variance at the *reference* batch, ``S`` the new global batch over
    the reference one (below 1 for a smaller batch, giving a gain in ``[S, 1]``). Noisy estimates
    can make either statistic negative; a non-positive ``mu2`` (all noise) gives the full gain
    ``S``, a non-positive ``sigma2`` (no noise) gives 1.

    Raises:
        ValueError: if ``scale`` is not positive.

    Example:
        >>> adascale_gain(sigma2=4.0, mu2=1.0, scale=4)
        2.5
        >>> adascale_gain(sigma2=0.0, mu2=1.0, scale=4), adascale_gain(sigma2=1.0, mu2=0.0, scale=4)
        (1.0, 4.0)
        >>> adascale_gain(sigma2=1.0, mu2=1.0, scale=0.5)
        0.6666666666666666
    """
    check_real("scale", scale, minimum=0.0, min_open=True)
    if sigma2 <= 0:
        return 1.0
    if mu2 <= 0:
        return float(scale)
    low, high = min(1.0, float(scale)), max(1.0, float(scale))
    return min(high, max(low, (sigma2 + mu2) / (sigma2 / scale + mu2)))


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
) -> torch.futures.Future[torch.Tensor]:  # evaluated annotations: torch checks ``bucket``'s
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


class AdaScaleTracker(GainTracker):
    """:class:`AdaScale`'s :class:`~lightning_bandlimit.strategies.scaling_rule.GainTracker`: measures the
    gradient statistics through a DDP communication hook and gives the LR gain they imply.

    Args:
        smoothing: the weight of each new measurement, in ``(0, 1]``.

    Example:
        >>> tracker = AdaScaleTracker(smoothing=1.0)
        >>> tracker.load_noise({"trace": 4.0, "mu2": 1.0})
        >>> tracker.step_gain(lambda t: t, world_size=4, batch=1, reference_batch=1), tracker.metrics()
        (2.5, {'ElasticDDPStrategy/gain': 2.5, 'ElasticDDPStrategy/noise_scale': 4.0})
        >>> tracker.progress(samples=4, reference_batch=1)
        2.5
    """

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing
        self.stats = AdaScaleGain()
        self._norms: GradientNormState | None = None

    @property
    def noise(self) -> dict[str, float]:  # type: ignore[override]
        """The running ``{"trace": tr(Sigma), "mu2": |G|^2}`` (empty until measured)."""
        return self.stats.noise

    @property
    def gain(self) -> float:
        """The last gain from :meth:`step_gain` (1 at first)."""
        return self.stats.gain

    def load_noise(self, noise: dict[str, float]) -> None:
        self.stats = AdaScaleGain(noise)

    def attach(self, ddp_model: Any, world_size: int, has_comm_hook: bool) -> None:
        """Register the gradient-norm hook on ``ddp_model`` (with 2+ processes).

        Raises:
            ValueError: if the model has another communication hook.
        """
        if world_size < 2:
            return
        if has_comm_hook:
            raise ValueError(
                "AdaScale measures gradients with its own DDP communication hook; drop ddp_comm_hook"
            )
        self._norms = GradientNormState()
        ddp_model.register_comm_hook(self._norms, gradient_norm_hook)

    def step_gain(
        self,
        reduce_mean: Callable[[torch.Tensor], torch.Tensor],
        world_size: int,
        batch: int,
        reference_batch: int,
    ) -> float:
        """Fold this backward's gradient norms into the statistics; the gain at this step's scale."""
        if self._norms is not None and self._norms.buckets:
            local = reduce_mean(self._norms.local_sq)
            self.stats.observe(float(local), float(self._norms.global_sq), world_size, batch, self.smoothing)
            self._norms.reset()
        return self.stats.update(world_size * batch / reference_batch, reference_batch)

    def progress(self, samples: int, reference_batch: int) -> float:
        """``gain x reference_batch``: the schedule advances by the reference batches this step is worth."""
        return self.gain * reference_batch

    def metrics(self) -> dict[str, float]:
        """The gain and, once measured, the gradient noise scale ``tr(Sigma) / |G|^2``."""
        metrics = {"ElasticDDPStrategy/gain": self.gain}
        if self.noise.get("mu2", 0) > 0:
            metrics["ElasticDDPStrategy/noise_scale"] = self.noise["trace"] / self.noise["mu2"]
        return metrics
