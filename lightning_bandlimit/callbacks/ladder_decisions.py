"""What :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` decides from and what it keeps.

* Under DDP the ranks agree on the inputs of a decision (:func:`agree_across_ranks`), so their
  controllers, fed the same, take the same decision on the same step.
* Each decision (and each out-of-memory retry) is kept as a record (:func:`decision_record`) in
  the callback's ``decisions`` and logged (:func:`log_decision`).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.reasons import REASON_CODES
from lightning_bandlimit.memory.probes import MemoryReading

__all__ = ["agree_across_ranks", "decision_record", "log_decision"]


def agree_across_ranks(
    strategy: Any,
    controller: LadderController,
    reading: MemoryReading,
    peak: int | None,
    device: torch.device | None,
) -> tuple[MemoryReading, int | None]:
    """What every rank decides from: the least free memory and total, the largest peak, the
    lowest top rung of any rank, and the continuum on the top rung only if every rank's blocks
    keep their spectrum. Sets the controller's top rung and continuum; one collective
    (``strategy.reduce`` with ``reduce_op="max"``)."""
    on_top = float(controller.continuum_on_top)
    mine = [-reading.free, -reading.total, float(peak or 0), -controller.top, -on_top]
    agreed = strategy.reduce(torch.tensor(mine, dtype=torch.float64, device=device), reduce_op="max").tolist()
    controller.agree_top(int(round(-agreed[3])))
    controller.set_continuum_on_top(-agreed[4] > 0.5)  # on the top rung only if on every rank
    total = int(round(-agreed[1]))
    agreed_reading = MemoryReading(
        total=total, free=min(int(round(-agreed[0])), total), source=reading.source
    )
    return agreed_reading, int(agreed[2]) or None


def decision_record(
    step: int,
    rung: int,
    units: int,
    compression: float,
    reason: str,
    free: int | None = None,
    peak: int | None = None,
    slowdown: float | None = None,
) -> dict[str, Any]:
    """One entry of ``AdaptiveBandLimit.decisions``: the setting after a check, and why."""
    return {
        "step": step,
        "rung": rung,
        "checkpointed_units": units,
        "compression": compression,
        "reason": reason,
        "free_bytes": free,
        "job_peak_bytes": peak,
        "slowdown": slowdown,
    }


def log_decision(pl_module: pl.LightningModule, name: str, record: dict[str, Any]) -> None:
    """Log a check's record as ``{name}/free_bytes``, ``.../decision``, ``.../rung``,
    ``.../checkpointed_units`` and, when known, ``.../slowdown`` and ``.../job_peak_bytes``."""

    def log(key: str, value: float) -> None:
        pl_module.log(f"{name}/{key}", value, on_step=True, on_epoch=False)

    log("free_bytes", float(record["free_bytes"]))
    log("decision", REASON_CODES[record["reason"]])
    log("rung", float(record["rung"]))
    log("checkpointed_units", float(record["checkpointed_units"]))
    if record["slowdown"] is not None:
        log("slowdown", record["slowdown"])
    if record["job_peak_bytes"]:
        log("job_peak_bytes", float(record["job_peak_bytes"]))
