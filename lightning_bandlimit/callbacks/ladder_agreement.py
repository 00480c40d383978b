"""Under DDP the ranks agree on the inputs of a decision (:func:`agree_across_ranks`,
:class:`Agreed`), so their controllers, fed the same, take the same decision on the same step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from lightning_bandlimit.callbacks.ladder_reading import JobMemory
from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.memory.protocol import MemoryReading

__all__ = ["Agreed", "agree_across_ranks"]


class Agreed(NamedTuple):
    """What every rank decides from (:func:`agree_across_ranks`)."""

    # the least free memory and total of any rank, the largest peak, and the largest peak less
    # the largest increment (base None unless every rank measured its step's start)
    measured: JobMemory
    top: int  # the lowest top rung of any rank
    continuum_on_top: bool  # on the top rung only if on every rank
    splits: int = 0  # the fewest micro-batch splits any rank has on its ladder


def agree_across_ranks(
    strategy: Any, controller: LadderController, mine: JobMemory | None, device: torch.device | None
) -> Agreed | None:
    """What every rank decides from: the least free memory and total, the largest peak, the
    largest step increment (peak less ``base``, what the rank held at the step's start; only
    when every rank measured it), the lowest top rung of any rank, and the continuum on the top
    rung only if every rank's blocks keep their spectrum, the fewest splits of any rank's ladder;
    ``None`` when any rank has no reading
    (``mine=None``: its probe failed or stopped), so that every rank skips the check together.
    One collective (``strategy.reduce`` with ``reduce_op="max"``); the caller gives the agreed
    top rung and continuum to its controller."""
    on_top = float(controller.continuum_on_top)
    reading, peak, base = (None, None, None) if mine is None else mine
    free, total = (0, 0) if reading is None else (reading.free, reading.total)
    measured = peak is not None and base is not None
    increment = float(peak - base) if measured else 0.0  # type: ignore[operator]
    vector = [-free, -total, float(peak or 0), -controller.top, -on_top, float(mine is None), increment]
    vector += [float(not measured), -float(len(controller.splits))]
    agreed = strategy.reduce(
        torch.tensor(vector, dtype=torch.float64, device=device), reduce_op="max"
    ).tolist()
    if agreed[5] > 0.5 or reading is None:
        return None
    total = int(round(-agreed[1]))
    agreed_reading = MemoryReading(
        total=total, free=min(int(round(-agreed[0])), total), source=reading.source
    )
    peak_agreed = int(agreed[2]) or None
    base_agreed = None
    if agreed[7] < 0.5 and peak_agreed is not None:
        base_agreed = max(0, peak_agreed - int(agreed[6]))
    memory = JobMemory(agreed_reading, peak_agreed, base_agreed)
    return Agreed(memory, int(round(-agreed[3])), -agreed[4] > 0.5, int(round(-agreed[8])))
