"""The one place the micro-batch lever touches private torchmetrics state: a metric's accumulated
state, saved and put back, so that the split trial leaves every torchmetrics ``Metric`` of the
module as it found it.

A metric's state is what it registered with ``add_state`` (the names in ``Metric._defaults``)
and the bookkeeping ``update``, ``compute`` and ``forward`` keep beside it (``_update_count``,
``_computed``, ``_forward_cache``): private torchmetrics fields, read and written here only.
"""

from __future__ import annotations

import copy
from typing import Any

from torchmetrics import Metric

__all__ = ["metric_state", "restore_metric_state"]

# the bookkeeping beside the registered states, each where the metric has it
_EXTRAS = ("_update_count", "_computed", "_forward_cache")


def metric_state(metric: Metric) -> dict[str, Any]:
    """A deep copy of ``metric``'s state (see the module docstring), by attribute name.

    Example:
        >>> import torch
        >>> from torchmetrics.aggregation import SumMetric
        >>> total = SumMetric(); total.update(torch.tensor(2.0))
        >>> saved = metric_state(total); total.update(torch.tensor(5.0))
        >>> restore_metric_state(total, saved); total.compute()
        tensor(2.)
    """
    names = [*metric._defaults, *(name for name in _EXTRAS if hasattr(metric, name))]
    return {name: copy.deepcopy(getattr(metric, name)) for name in names}


def restore_metric_state(metric: Metric, state: dict[str, Any]) -> None:
    """Put back a :func:`metric_state` of ``metric``."""
    for name, value in state.items():
        setattr(metric, name, value)
