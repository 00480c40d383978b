"""The elastic benchmark's summary: per-configuration statistics, the table, the plot, the versions."""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import REPO_ROOT
from benchmarks.common.stats import PairedDifference
from benchmarks.elastic.plan import ALL_RULES, OPTIMIZERS, TARGET_POINTS
from lightning_bandlimit.utils.tables import markdown_table
from lightning_bandlimit.utils.versions import library_versions


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per optimizer, schedule and rule: accuracy over seeds and, for resized rows, the
    paired difference to the fixed run of the same seed with its 95 % interval and verdict."""

    def mean_std(values: list[float]) -> tuple[float, float]:
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["optimizer"], r["schedule"], r["rule"]), []).append(r)
    rows = []
    for (optimizer, schedule, rule), runs in groups.items():
        fixed = {r["seed"]: r for r in groups.get((optimizer, "fixed", "none"), [])}
        acc_mean, acc_std = mean_std([100 * r["val_acc"] for r in runs])
        fixed_mean = statistics.fmean(100 * r["val_acc"] for r in fixed.values()) if fixed else math.nan
        paired_seeds = sorted(r["seed"] for r in runs if r["seed"] in fixed)
        by_seed = {r["seed"]: r for r in runs}
        paired = [100 * (by_seed[s]["val_acc"] - fixed[s]["val_acc"]) for s in paired_seeds]
        diff = PairedDifference.of(paired, TARGET_POINTS)
        resized = schedule != "fixed"
        rows.append(
            {
                "optimizer": optimizer,
                "schedule": schedule,
                "rule": rule,
                "seeds": sorted(r["seed"] for r in runs),
                "n": len(runs),
                "acc_mean": acc_mean,
                "acc_std": acc_std,
                "diff_points": acc_mean - fixed_mean,
                "paired_seeds": paired_seeds if resized else [],
                "paired_diffs": paired if resized else [],
                "paired_diff_mean": diff.mean if resized else math.nan,
                "paired_diff_std": diff.std if resized else math.nan,
                "ci95_low": diff.low if resized else math.nan,
                "ci95_high": diff.high if resized else math.nan,
                "verdict": diff.verdict if resized else None,
                # from the interval: True within, False outside, None unresolved (or the fixed row)
                "within_target": {"outside": False, "unresolved": None}.get(diff.verdict, True)
                if resized
                else None,
                "layouts": runs[0].get("layouts"),
                "wall_s_mean": statistics.fmean(r["wall_s"] for r in runs),
                "fit_s_mean": statistics.fmean(r["fit_s"] for r in runs),
                "rollbacks": sum(r["rollbacks"] for r in runs),
            }
        )
    return rows


def _layout(row: dict[str, Any]) -> str:
    """Processes x micro-batch x accumulation per phase, e.g. ``1x64x1, 2x32x1, 1x64x1``."""
    layouts = row.get("layouts") or []
    return ", ".join(f"{x['devices']}x{x['micro_batch']}x{x['accumulation']}" for x in layouts)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table (one row per optimizer, schedule and rule)."""
    header = [
        "opt",
        "schedule",
        "rule",
        "procs x micro x accum",
        "n",
        "val acc % (mean +- std)",
        "paired diff (mean +- std)",
        "95 % interval",
        f"verdict (+-{TARGET_POINTS:g})",
        "wall s",
        "fit s",
        "rollb",
    ]
    cells = []
    for r in rows:
        fixed = r["schedule"] == "fixed"
        cells.append(
            [
                r["optimizer"],
                r["schedule"],
                r["rule"],
                _layout(r),
                r["n"],
                f"{r['acc_mean']:.2f} +- {r['acc_std']:.2f}",
                "-" if fixed else f"{r['paired_diff_mean']:+.2f} +- {r['paired_diff_std']:.2f}",
                "-" if fixed else f"[{r['ci95_low']:+.2f}, {r['ci95_high']:+.2f}]",
                "-" if fixed else r["verdict"],
                f"{r['wall_s_mean']:.1f}",
                f"{r['fit_s_mean']:.1f}",
                r["rollbacks"],
            ]
        )
    return markdown_table(header, cells)


def _finite(value: float) -> float:
    return value if math.isfinite(value) else math.nan  # no error bar for an unbounded interval


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Top: val accuracy (mean +- std over seeds) with the fixed run's mean and a +-0.5-point band.
    Bottom: the paired difference to the fixed run of the same seed, mean and 95 % interval, target band
    0 +- 0.5."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    optimizers = [o for o in OPTIMIZERS if any(r["optimizer"] == o for r in rows)]
    fig = Figure(figsize=(5.5 * len(optimizers), 7.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(optimizers), squeeze=False)
    markers = {
        "1-1-1": ("^", "tab:gray", "restarted 1-1-1 (control)"),
        "1-2-1": ("o", "tab:blue", "resized 1-2-1"),
        "1-4x-1": ("s", "tab:orange", "resized 1-4x-1"),
    }
    for column, optimizer in enumerate(optimizers):
        top, bottom = axes[0][column], axes[1][column]
        mine = [r for r in rows if r["optimizer"] == optimizer]
        rules = [r for r in ALL_RULES if any(x["rule"] == r and x["schedule"] != "fixed" for x in mine)]
        fixed = next((r for r in mine if r["schedule"] == "fixed"), None)
        if fixed is not None:
            top.axhline(fixed["acc_mean"], color="k", lw=1, label="fixed run (1 process), mean over seeds")
            top.axhspan(
                fixed["acc_mean"] - TARGET_POINTS,
                fixed["acc_mean"] + TARGET_POINTS,
                color="0.85",
                label="target: within 0.5 points of it",
            )
        bottom.axhline(0.0, color="k", lw=1)
        bottom.axhspan(-TARGET_POINTS, TARGET_POINTS, color="0.85")
        schedules = [s for s in markers if any(r["schedule"] == s for r in mine)]
        for k, schedule in enumerate(schedules):
            marker, colour, label = markers[schedule]
            offset = (k - (len(schedules) - 1) / 2) * 0.18
            points = [
                (i + offset, r)
                for i, rule in enumerate(rules)
                for r in mine
                if (r["rule"], r["schedule"]) == (rule, schedule)
            ]
            xs = [x for x, _ in points]
            top.errorbar(
                xs,
                [r["acc_mean"] for _, r in points],
                yerr=[r["acc_std"] for _, r in points],
                fmt=marker,
                color=colour,
                capsize=3,
                label=label,
            )
            bottom.errorbar(
                xs,
                [r["paired_diff_mean"] for _, r in points],
                yerr=[
                    [_finite(r["paired_diff_mean"] - r["ci95_low"]) for _, r in points],
                    [_finite(r["ci95_high"] - r["paired_diff_mean"]) for _, r in points],
                ],
                fmt=marker,
                color=colour,
                capsize=3,
                label=label,
            )
        for ax in (top, bottom):
            ax.set_xticks(range(len(rules)), rules, rotation=20)
            ax.grid(axis="y", alpha=0.3)
        where = "" if fixed is None else f"; fixed {fixed['acc_mean']:.2f} +- {fixed['acc_std']:.2f}"
        top.set_title(f"{optimizer}: val accuracy, mean +- std over seeds{where}", fontsize=9)
        top.set_ylabel("val/acc (%)")
        bottom.set_title(f"{optimizer}: minus the fixed run of the same seed (mean, 95 % CI)", fontsize=9)
        bottom.set_ylabel("difference (points)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    ncol = len(labels) if len(optimizers) > 1 else 2  # one narrow column: the legend in two rows
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 if ncol == len(labels) else 0.08, 1, 1))
    fig.savefig(path, dpi=110)


def versions() -> dict[str, Any]:
    """Library versions, the CPU, the git commit (and whether the tree is dirty), the time."""

    def git(*cmd: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *cmd], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    cpu = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    status = git("status", "--porcelain")
    return {
        **library_versions(("torch", "lightning")),
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
    }
