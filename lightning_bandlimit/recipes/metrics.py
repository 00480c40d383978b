"""Means and maxima of per-sample results, computed with torchmetrics (float64 means)."""

from __future__ import annotations

import torch
from torchmetrics import MaxMetric, MeanMetric

__all__ = ["maximum", "mean"]


def mean(values: torch.Tensor) -> float:
    """The mean of ``values`` in float64 (NaN kept).

    Example:
        >>> mean(torch.tensor([True, False, True]).float())
        0.6666666666666666
    """
    metric = MeanMetric(nan_strategy="disable").set_dtype(torch.float64)
    metric.update(values.double())
    return float(metric.compute())


def maximum(values: torch.Tensor) -> float:
    """The largest of ``values``.

    Example:
        >>> maximum(torch.tensor([0.5, 2.0]))
        2.0
    """
    metric = MaxMetric(nan_strategy="disable")
    metric.update(values.float())
    return float(metric.compute())
