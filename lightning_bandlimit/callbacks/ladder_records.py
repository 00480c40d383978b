"""What :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` keeps and says of its decisions:
each decision (and each out-of-memory retry) is kept as a record (:func:`decision_record`) in the
callback's ``decisions`` and logged (:func:`log_decision`); a change of setting is said in one
line (:func:`describe_change`). Each record says how far its setting is from the plain job's
gradient (:func:`exactness`): ``"exact"`` (rungs, an exact split), ``"ghost"`` (a split whose
chunks BatchNorm normalises by their own statistics) or ``"lossy"`` (a compression).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lightning_bandlimit.ladder.reasons import REASON_CODES
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.utils.units import MIB

__all__ = ["EXACTNESS", "decision_record", "describe_change", "exactness", "log_decision"]

#: a setting's distance from the plain job's gradient, nearest first
EXACTNESS = ("exact", "ghost", "lossy")


def exactness(split: int, compression: float, ghost: bool) -> str:
    """``"lossy"`` with a compression, ``"ghost"`` for a ghost-batch split (``ghost``: the split
    lever's trial found one), else ``"exact"``.

    Example:
        >>> exactness(1, 0.0, ghost=True), exactness(4, 0.0, ghost=True), exactness(4, 0.3, ghost=False)
        ('exact', 'ghost', 'lossy')
    """
    if compression > 0:
        return "lossy"
    return "ghost" if ghost and split > 1 else "exact"


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
    ghost: bool = False,
) -> dict[str, Any]:
    """One entry of ``AdaptiveBandLimit.decisions``: the setting after a check, and why
    (``baseline``: what the job held at its measured step's start; ``split``: the chunks a
    step's batch runs in; ``ghost``: whether a split is a ghost-batch split, see
    :func:`exactness`)."""
    return {
        "step": step,
        "rung": rung,
        "split": split,
        "checkpointed_units": units,
        "compression": compression,
        "exactness": exactness(split, compression, ghost),
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


def describe_change(step: int, previous: Setting, decision: Decision, units: int, ghost: bool = False) -> str:
    """A change of setting in one line: what moved, why, and the free memory it was decided at
    (``ghost``: a split is a ghost-batch split, said so).

    Example:
        >>> describe_change(7, Setting(0, 0.0), Decision(2, 0.0, "raise", 3 * 2**20, 4 * 2**20), units=4)
        'step 7: rung 0 -> 2 (4 units checkpointed) (raise: 3 MiB free, threshold 4 MiB)'
        >>> split = Decision(2, 0.0, "raise", 3 * 2**20, 4 * 2**20, split=2)
        >>> describe_change(8, Setting(2, 0.0), split, 4, ghost=True)  # doctest: +NORMALIZE_WHITESPACE
        'step 8: split 1 -> 2 (the batch in 2 chunks, ghost batches: approximate)
         (raise: 3 MiB free, threshold 4 MiB)'
    """
    changes = []
    if decision.rung != previous.rung:
        changes.append(f"rung {previous.rung} -> {decision.rung} ({units} units checkpointed)")
    if decision.split != previous.split:
        chunks = f"the batch in {decision.split} chunks" if decision.split > 1 else "the whole batch"
        if ghost and decision.split > 1:
            chunks += ", ghost batches: approximate"
        changes.append(f"split {previous.split} -> {decision.split} ({chunks})")
    if decision.compression != previous.compression:
        changes.append(f"compression {previous.compression:.3f} -> {decision.compression:.3f}")
    return (
        f"step {step}: {', '.join(changes)} ({decision.reason}: "
        f"{decision.free / MIB:.0f} MiB free, threshold {decision.threshold / MIB:.0f} MiB)"
    )
