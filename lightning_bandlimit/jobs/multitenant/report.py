"""What the multi-tenant scenario's jobs measured, read against a budget: the budget a plain job
does not fit (:func:`budget_for`), the adaptive job's thresholds (:func:`adaptive_thresholds`),
the steps over budget (:func:`over_budget`) and the jobs' memory and settings over their steps
(:func:`plot_timelines`)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from lightning_bandlimit.callbacks.shared_budget import over_budget_steps
from lightning_bandlimit.jobs.multitenant.spec import JobResult
from lightning_bandlimit.memory.cotenant import RampTrace
from lightning_bandlimit.utils.units import MIB
from lightning_bandlimit.utils.validation import check_real

__all__ = ["adaptive_thresholds", "budget_for", "over_budget", "plot_timelines"]


def _phase(result: JobResult, trace: RampTrace, hold: bool) -> list[dict[str, Any]]:
    steps = max(len(result.timeline), 1)
    rows = [
        r
        for i, r in enumerate(result.timeline)
        if (trace.start + trace.ramp <= i / steps < trace.leave) == hold
    ]
    return rows or result.timeline


def budget_for(plain: JobResult, trace: RampTrace, below: float = 0.25) -> int:
    """A budget the plain job does not fit beside the co-tenant's peak.

    ``below`` of the plain job's step increment (its peak minus its resident set at the start
    of a step, median) under the median of plain job + co-tenant while the co-tenant holds its
    peak: every compression that saves more than that fits, the plain job does not.

    Raises:
        ValueError: unless ``0 < below < 1``.
    """
    check_real("below", below, minimum=0, maximum=1, min_open=True, max_open=True)
    held = statistics.median(r["job_bytes"] + r["cotenant_bytes"] for r in _phase(plain, trace, hold=True))
    return int(held - below * plain.step_increment_bytes)


def over_budget(result: JobResult, budget: int) -> int:
    """Steps of ``result`` whose job peak plus co-tenant exceeded ``budget``."""
    return over_budget_steps(result.timeline, budget)


def adaptive_thresholds(plain: JobResult) -> tuple[int, int]:
    """``min_free`` and ``release_free`` for the adaptive job: 0.08 and 0.5 of the plain job's step memory."""
    return int(0.08 * plain.step_increment_bytes), int(0.5 * plain.step_increment_bytes)


def plot_timelines(results: list[JobResult], budget: int, path: Path, title: str = "") -> None:
    """Budget, job + co-tenant memory of each job, checkpointed units and compression, over the steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, middle, rungs, bottom) = plt.subplots(
        4, 1, figsize=(9, 9), sharex=True, height_ratios=[3, 1.2, 1.5, 1.5]
    )
    for result in results:
        steps = [r["step"] for r in result.timeline]
        top.plot(
            steps,
            [(r["job_bytes"] + r["cotenant_bytes"]) / MIB for r in result.timeline],
            label=f"{result.name} + co-tenant",
        )
        bottom.plot(steps, [r["compression"] for r in result.timeline], label=result.name)
        rungs.step(
            steps, [r.get("checkpointed_units", 0) for r in result.timeline], where="post", label=result.name
        )
    first = results[0].timeline
    middle.plot([r["step"] for r in first], [r["cotenant_bytes"] / MIB for r in first], color="grey")
    top.axhline(budget / MIB, color="red", ls="--", label="budget")
    top.set_ylabel("resident MiB\n(job's step peak + co-tenant)", fontsize=9)
    top.legend(fontsize=8, loc="upper left")
    middle.set_ylabel("co-tenant MiB", fontsize=9)
    rungs.set_ylabel("checkpointed\nunits (exact)", fontsize=9)
    rungs.legend(fontsize=8, loc="upper left")
    bottom.set_ylabel("compression\n(lossy)", fontsize=9)
    bottom.set_xlabel("training step")
    bottom.set_ylim(-0.05, 1)
    bottom.legend(fontsize=8, loc="upper left")
    if title:
        top.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
