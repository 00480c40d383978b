"""What :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` keeps and says of its decisions:
each decision (and each out-of-memory retry) is kept as a record (:func:`decision_record`) in the
callback's ``decisions`` and logged (:func:`log_decision`); a change of setting is said in one
line (:func:`describe_change`).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lightning_bandlimit.ladder.reasons import REASON_CODES
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.utils.units import MIB

__all__ = ["decision_record", "describe_change", "log_decision"]


def decision_record(
    step: int,
    rung: int,
    units: int,
    compression: float,
    reason: str,
    free: int | None = None,
    peak: int | None = None,
    slowdown: float | None = None,
    baseline: int | None = None,
    split: int = 1,
) -> dict[str, Any]:
    """One entry of ``AdaptiveBandLimit.decisions``: the setting after a check, and why
    (``baseline``: what the job held at its measured step's start; ``split``: the chunks a
    step's batch runs in)."""
    return {
        "step": step,
        "rung": rung,
        "split": split,
        "checkpointed_units": units,
        "compression": compression,
        "reason": reason,
        "free_bytes": free,
        "job_peak_bytes": peak,
        "slowdown": slowdown,
        "baseline_bytes": baseline,
    }


def log_decision(pl_module: pl.LightningModule, name: str, record: dict[str, Any]) -> None:
    """Log a check's record as ``{name}/free_bytes``, ``.../decision``, ``.../rung``,
    ``.../checkpointed_units``, ``.../split`` and, when known, ``.../slowdown``, ``.../job_peak_bytes`` and
    ``.../baseline_bytes``."""

    def log(key: str, value: float) -> None:
        pl_module.log(f"{name}/{key}", value, on_step=True, on_epoch=False)

    log("free_bytes", float(record["free_bytes"]))
    log("decision", REASON_CODES[record["reason"]])
    log("rung", float(record["rung"]))
    log("checkpointed_units", float(record["checkpointed_units"]))
    log("split", float(record.get("split", 1)))
    if record["slowdown"] is not None:
        log("slowdown", record["slowdown"])
    if record["job_peak_bytes"]:
        log("job_peak_bytes", float(record["job_peak_bytes"]))
    if record.get("baseline_bytes") is not None:
        log("baseline_bytes", float(record["baseline_bytes"]))


def describe_change(step: int, previous: Setting, decision: Decision, units: int) -> str:
    """A change of setting in one line: what moved, why, and the free memory it was decided at.

    Example:
        >>> describe_change(7, Setting(0, 0.0), Decision(2, 0.0, "raise", 3 * 2**20, 4 * 2**20), units=4)
        'step 7: rung 0 -> 2 (4 units checkpointed) (raise: 3 MiB free, threshold 4 MiB)'
    """
    changes = []
    if decision.rung != previous.rung:
        changes.append(f"rung {previous.rung} -> {decision.rung} ({units} units checkpointed)")
    if decision.split != previous.split:
        chunks = f"the batch in {decision.split} chunks" if decision.split > 1 else "the whole batch"
        changes.append(f"split {previous.split} -> {decision.split} ({chunks})")
    if decision.compression != previous.compression:
        changes.append(f"compression {previous.compression:.3f} -> {decision.compression:.3f}")
    return (
        f"step {step}: {', '.join(changes)} ({decision.reason}: "
        f"{decision.free / MIB:.0f} MiB free, threshold {decision.threshold / MIB:.0f} MiB)"
    )
