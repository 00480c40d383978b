"""Precise BatchNorm statistics: re-estimate running statistics for the model as it is now.

BatchNorm's running statistics are an exponential average over past training batches, so they
describe the function the network computed a few dozen steps ago. A new compression changes
every band-limited layer's output at once, and the averages still belong to the old one until
enough batches pass; at a fixed compression they lag behind fast-moving weights. "Precise BN"
(Wu & Johnson 2021; ``torch.optim.swa_utils.update_bn``; fvcore's ``update_bn_stats``) replaces
them by the plain average of the batch statistics over a few forward passes with the current
weights, in train mode and without gradients.

:func:`recalibrate_batchnorm` does that for any model; :class:`RecentBatches` keeps the last few
training batches (on the host) to do it with. The band-limit callbacks use both.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from torch import nn

from lightning_bandlimit.utils.validation import check_int

__all__ = ["Forward", "RecentBatches", "batchnorm_modules", "default_forward", "recalibrate_batchnorm"]

Forward = Callable[[nn.Module, Any], Any]
"""How to run the model on one batch: ``forward(model, batch)``."""


def batchnorm_modules(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The model's BatchNorm modules that keep running statistics."""
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        and m.track_running_stats
        and m.running_mean is not None
    ]


def default_forward(model: nn.Module, batch: Any) -> Any:
    """``model(batch)`` for a tensor, ``model(batch[0])`` for a list or tuple starting with one.

    Raises:
        TypeError: for any other batch (pass your own ``forward``).
    """
    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return model(batch[0])
    raise TypeError(
        "cannot find the model input in a batch of type "
        f"{type(batch).__name__}: expected a tensor or a list/tuple whose first item is the input "
        "tensor; pass forward=lambda model, batch: model(...) to say how"
    )


def recalibrate_batchnorm(model: nn.Module, batches: Iterable[Any], forward: Forward | None = None) -> int:
    """Re-estimate the running mean and variance of every BatchNorm in ``model`` from ``batches``.

    Each BatchNorm's statistics are reset and become the plain average of its batch statistics
    over the forward passes (``momentum=None``), run in train mode under ``torch.no_grad()``
    with the global random state left as it was. Afterwards momentum, each module's train/eval
    flag and the random state are restored. If no batch is given or a forward raises, the old
    statistics are put back, so nothing is lost.

    Args:
        model: the model (its BatchNorm modules are found by type, lean twins included).
        batches: batches, already on the model's device.
        forward: how to run the model on a batch (default: :func:`default_forward`).

    Returns:
        The number of batches used.

    Raises:
        ValueError: if ``batches`` is empty (the statistics are left as they were).
        TypeError: from :func:`default_forward` for a batch it cannot read.

    Example:
        >>> bn_model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        >>> data = [torch.randn(16, 4) * 3 + 1 for _ in range(4)]
        >>> recalibrate_batchnorm(bn_model, data)
        4
        >>> bool(bn_model[1].running_mean.abs().sum() > 0), bn_model.training
        (True, True)
    """
    forward = forward or default_forward
    norms = batchnorm_modules(model)
    if not norms:
        return 0
    saved = [
        (m, m.momentum, m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
        for m in norms
    ]
    flags = [(m, m.training) for m in model.modules()]
    used = 0
    try:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None
        model.train()
        devices = [t.device for t in (norms[0].running_mean,) if t.device.type == "cuda"]
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            for batch in batches:
                forward(model, batch)
                used += 1
        if used == 0:
            raise ValueError("recalibrate_batchnorm needs at least one batch, got none")
    except BaseException:
        for m, _, mean, var, tracked in saved:
            m.running_mean.copy_(mean)
            m.running_var.copy_(var)
            m.num_batches_tracked.copy_(tracked)
        raise
    finally:
        for m, momentum, *_ in saved:
            m.momentum = momentum
        for m, training in flags:
            m.training = training
    return used


class RecentBatches:
    """The last ``size`` batches seen, detached and kept on the host.

    Tensors on an accelerator are copied to the host (so keeping them costs no device memory);
    host tensors are kept as they are (a data loader yields fresh tensors every step).

    Args:
        size: how many batches to keep, at least 1.

    Raises:
        ValueError: if ``size`` is below 1.

    Example:
        >>> recent = RecentBatches(2)
        >>> for i in range(3):
        ...     recent.append((torch.full((1,), float(i)), i))
        >>> [int(x) for x, _ in recent.on(torch.device("cpu"))]
        [1, 2]
    """

    def __init__(self, size: int) -> None:
        check_int("size", size, minimum=1)
        self._batches: collections.deque[Any] = collections.deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._batches)

    def append(self, batch: Any) -> None:
        self._batches.append(apply_to_collection(batch, torch.Tensor, lambda t: t.detach().to("cpu")))

    def clear(self) -> None:
        """Forget every batch."""
        self._batches.clear()

    def on(self, device: torch.device) -> Iterator[Any]:
        """The batches, oldest first, moved to ``device`` one at a time."""
        for batch in list(self._batches):
            yield apply_to_collection(batch, torch.Tensor, lambda t: t.to(device))
