"""What the main job prints: the side-by-side table, its legend and the verdict computed from its rows.

:mod:`lightning_bandlimit.jobs.main_job` runs the full-spectrum, ladder and band-limited jobs and
prints, from their results, :func:`main_table` (one row per job: validation accuracy, rung and
compression spans, peak and per-step memory, over-budget steps, step time, BatchNorm
re-estimation time, wall time), :func:`main_legend` (what the columns mean and what one run
cannot show) and :func:`main_verdict` (one line per memory-aware job against the plain one, and
the ladder's targets); the verdict is also written to ``summary.json``.
"""

from __future__ import annotations

from lightning_bandlimit.jobs.multitenant import HOST_ALLOCATOR_ENV, JobResult, over_budget
from lightning_bandlimit.utils.units import MIB

__all__ = ["main_legend", "main_table", "main_verdict"]


def _span(values: list[float], final: float, fmt: str) -> str:
    low, high = min(values), max(values)
    return f"{low:{fmt}}-{high:{fmt}}->{final:{fmt}}" if high > low else f"{final:{fmt}}"


def main_table(rows: list[tuple[str, JobResult]], budget: int) -> str:
    """The side-by-side table: one row per ``(variant, result)``, over-budget steps against ``budget``."""
    header = (
        f"{'variant':<14} {'val acc':>7} {'rung':>7} {'compression':>15} {'peak MiB':>8} {'step +MiB':>9} "
        f"{'over budget':>11} {'step ms':>7} {'BN s':>5} {'wall s':>6}"
    )
    lines = [header]
    for variant, r in rows:
        rungs = [t.get("rung", 0) for t in r.timeline]
        lines.append(
            f"{variant:<14} {r.val_accuracy:>7.3f} "
            f"{_span(rungs, rungs[-1], 'd') if r.rungs else '-':>7} "
            f"{_span([t['compression'] for t in r.timeline], r.final_compression, '.2f'):>15} "
            f"{r.peak_job_bytes / MIB:>8.0f} "
            f"{r.step_increment_bytes / MIB:>9.1f} {over_budget(r, budget):>5}/{len(r.timeline):<5} "
            f"{r.step_ms:>7.0f} "
            f"{r.bn_recalibration_seconds:>5.1f} {r.wall_s:>6.0f}"
        )
    return "\n".join(lines)


def main_verdict(plain: JobResult, ladder: JobResult, limited: JobResult, budget: int) -> list[str]:
    """One line per memory-aware job, computed from the table's rows, and the ladder's targets."""
    steps = len(plain.timeline)
    lines = [f"verdict: the plain job overdrew the budget at {over_budget(plain, budget)} of {steps} steps."]
    for name, job in (("ladder", ladder), ("compression-only", limited)):
        rungs = [t.get("rung", 0) for t in job.timeline]
        compressions = [t["compression"] for t in job.timeline]
        lines.append(
            f"  {name}: {over_budget(job, budget)} over-budget steps; "
            f"{100 * (job.val_accuracy - plain.val_accuracy):+.1f} accuracy points from the plain job; "
            f"{job.wall_s / plain.wall_s:.2f}x its wall time; rung {min(rungs)}-{max(rungs)} of {job.rungs}, "
            f"compression {min(compressions):.2f}-{max(compressions):.2f}"
        )
    targets = {
        "0 over-budget steps": over_budget(ladder, budget) == 0,
        "within 1 point of plain": ladder.val_accuracy - plain.val_accuracy >= -0.01,
        "wall time <= 1.15x plain": ladder.wall_s <= 1.15 * plain.wall_s,
    }
    lines.append(
        "  ladder targets (one seed, no interval; benchmarks/tenants/multitenant.py has 3 seeds): "
        + ", ".join(f"{k} {'PASS' if ok else 'FAIL'}" for k, ok in targets.items())
    )
    return lines


def main_legend(budget: int, cotenant_low_mib: float, cotenant_high_mib: float, limited: JobResult) -> str:
    """What the table's columns mean and what one run cannot show (printed after the table).

    Args:
        budget: the jobs' memory budget in bytes.
        cotenant_low_mib: the co-tenant's memory before it grows and after it leaves.
        cotenant_high_mib: the co-tenant's memory at its peak.
        limited: the band-limited job, whose share of wall time in BatchNorm re-estimation is said.
    """
    share = limited.bn_recalibration_seconds / limited.wall_s if limited.wall_s else float("nan")
    return (
        f"\nbudget {budget / MIB:.0f} MiB shared with a co-tenant process ({cotenant_low_mib:.0f} -> "
        f"{cotenant_high_mib:.0f} MiB "
        "and back). peak MiB: the job's largest resident set in a training step (measured in /proc);\n"
        "step +MiB: median growth of the resident set within a step; over budget: steps whose peak plus the\n"
        "co-tenant's memory exceeded the budget (on a GPU, an out-of-memory error); BN s: BatchNorm "
        "re-estimation\n"
        f"time ({100 * share:.1f} % of the band-limited job's wall time); rung: checkpointed stages of\n"
        f"residual blocks (exact; 'a-b->c': range, then final). All jobs run with {HOST_ALLOCATOR_ENV} so\n"
        "that freed tensors leave the resident set; with glibc's default heap it keeps its high-water mark.\n"
        "One seed (the recipe's seed_everything): accuracies move by several points between seeds on this "
        "budget;\n"
        "python -m benchmarks.tenants.multitenant gives 3 seeds per setting with mean +- std. What it "
        "cannot show: a GPU's\n"
        "allocator (no GPU here), or a co-tenant that grows faster than one check (one step)."
    )
