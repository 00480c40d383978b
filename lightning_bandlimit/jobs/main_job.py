"""The main job: a recipe trained beside a growing co-tenant, plain and memory-aware, then attacked.

``python -m lightning_bandlimit.jobs.main_job`` (README command 1) runs the multi-tenant scenario of
:mod:`lightning_bandlimit.jobs.multitenant` on the ``quickstart`` recipe:

1. the **full-spectrum** job: the recipe with plain ``nn.Conv2d`` (what a user would otherwise
   run) beside a co-tenant process whose memory rises a quarter into the run, holds, and
   leaves at 70 %; its resident memory is measured every step;
2. a **budget** chosen from that measurement so that the plain job does NOT fit beside the
   co-tenant's peak (:func:`~lightning_bandlimit.jobs.multitenant.budget_for`);
3. the **ladder** job: the same recipe with an
   :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` with both levers, from
   compression 0, on that budget: it checkpoints stages of residual blocks (exact) as the
   co-tenant grows, raises the compression only beyond them, and gives everything back when
   the co-tenant leaves;
4. the **band-limited** job: the compression-only ``AdaptiveBandLimit`` (``levers:
   [compression]``) whose floor is the recipe's compression (the band-limited model the
   robustness report compares);

then prints the side-by-side table and a verdict computed from its rows
(:mod:`~lightning_bandlimit.jobs.main_report`), writes the timeline plot, and evaluates the
full-spectrum and band-limited checkpoints under attack with the ``robustness`` recipe::

    runs/main-<timestamp>/
        full-spectrum/   spec.json, job.log, result.json (per-step timeline), checkpoints, metrics.csv
        ladder/          the same for the ladder job
        band-limited/    the same for the compression-only job
        timeline.png     budget, job + co-tenant memory of the jobs, rung, compression
        summary.json     the table, budget, trace, versions, wall times
        robustness/      results.json/.csv, accuracy_vs_eps.png, heat maps, summary.md
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import platform
import sys
import time
import warnings
from argparse import ArgumentError
from dataclasses import asdict
from pathlib import Path

import lightning
import torch

from lightning_bandlimit.jobs.cli import BandLimitCLI
from lightning_bandlimit.jobs.main_report import main_legend, main_table, main_verdict
from lightning_bandlimit.jobs.multitenant import (
    HOST_ALLOCATOR_ENV,
    JobSpec,
    adaptive_thresholds,
    budget_for,
    launch,
    over_budget,
    plot_timelines,
)
from lightning_bandlimit.memory.cotenant import RampTrace
from lightning_bandlimit.utils.command_line import (
    CommandLineError,
    debugging,
    exit_with_error,
    one_line_error,
)
from lightning_bandlimit.utils.files import atomic_write_json
from lightning_bandlimit.utils.main_run import SUMMARY_NAME
from lightning_bandlimit.utils.recipe_files import recipe_path
from lightning_bandlimit.utils.units import MIB
from lightning_bandlimit.utils.validation import check_real

__all__ = ["main"]

# The main job's training budget on 2 CPU cores (the recipe's own: 6 epochs of 10240 images in
# batches of 128). Batches of 256 double the memory a step takes, against the same process base.
DEFAULT_OVERRIDES = ["--trainer.max_epochs", "3", "--data.train_size", "8192", "--data.batch_size", "256"]
DEFAULT_ROBUSTNESS = ["--limit", "64", "--heat_map_limit", "64"]
# BatchNorm re-estimated over 2 batches of 256 before each validation (512 images).
RECALIBRATE_BN = 2


def _check_arguments(
    recipe: str,
    output_dir: str,
    overrides: list[str],
    cotenant_low_mib: float,
    cotenant_high_mib: float,
    budget_below: float,
) -> RampTrace:
    """:func:`main`'s arguments checked before any work; returns the co-tenant's trace."""
    recipe_path(recipe, option="--recipe")
    check_real("budget_below", budget_below, minimum=0, maximum=1, min_open=True, max_open=True)
    low = check_real("cotenant_low_mib", cotenant_low_mib, minimum=0)
    high = check_real("cotenant_high_mib", cotenant_high_mib, minimum=low)
    ramp = RampTrace(low=int(low * MIB), high=int(high * MIB))
    _check_output_dir(Path(output_dir))
    _check_overrides(recipe, tuple(overrides))
    return ramp


def _check_output_dir(path: Path) -> None:
    existing = next(p for p in [path, *path.absolute().parents] if p.exists())
    if not existing.is_dir():
        raise ValueError(f"output_dir {str(path)!r} cannot be created: {str(existing)!r} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"output_dir {str(path)!r} cannot be created: {str(existing)!r} is not writable")


@functools.cache  # _cli checks before it calls main, which checks again
def _check_overrides(recipe: str, overrides: tuple[str, ...]) -> None:
    """Build the recipe's classes with ``overrides`` (no training, no seeding) to reject bad ones early."""
    lightning_log = logging.getLogger("lightning.pytorch")  # Lightning's documented console logger
    level = lightning_log.level
    lightning_log.setLevel(logging.WARNING)  # the jobs print the trainer's summary, not this check
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # args is on purpose
            cli = BandLimitCLI(
                args=["--config", recipe, *overrides, "--seed_everything", "false"],
                run=False,
                usage_errors=True,
            )
    except CommandLineError as error:
        raise ValueError(f"overrides: {error}") from error
    finally:
        lightning_log.setLevel(level)
    max_epochs, max_steps = cli.trainer.max_epochs, cli.trainer.max_steps
    if max_epochs == 0 or max_steps == 0:
        raise ValueError(
            f"overrides: the jobs must train at least one step, got max_epochs={max_epochs}, "
            f"max_steps={max_steps}"
        )
    if max_epochs in (None, -1) and max_steps == -1:
        raise ValueError(
            f"overrides: the jobs must end: set --trainer.max_epochs or --trainer.max_steps, got "
            f"max_epochs={max_epochs}, max_steps={max_steps}"
        )


def main(
    recipe: str = "quickstart",
    output_dir: str = "runs",
    overrides: list[str] | None = None,
    cotenant_low_mib: float = 32.0,
    cotenant_high_mib: float = 192.0,
    budget_below: float = 0.2,
    robustness: bool = True,
    robustness_overrides: list[str] | None = None,
) -> Path:
    """Run the multi-tenant scenario on ``recipe`` (plain, the ladder, compression-only), then attack.

    Args:
        recipe: recipe name (``lightning-bandlimit recipes``) or a config path; its
            ``BandLimit`` compression is the compression-only job's floor.
        output_dir: parent of the run folder ``main-<timestamp>``.
        overrides: LightningCLI arguments for all jobs; default: 3 epochs of 8192 images in
            batches of 256 (the main job's time on 2 CPU cores), e.g.
            ``'[--trainer.max_epochs, "2"]'``.
        cotenant_low_mib: the co-tenant's memory before it grows and after it leaves.
        cotenant_high_mib: the co-tenant's memory at its peak.
        budget_below: the budget sits this fraction of the plain job's step memory below what
            the plain job and the co-tenant's peak need together.
        robustness: run the ``robustness`` recipe on the full-spectrum and band-limited
            checkpoints at the end.
        robustness_overrides: arguments for ``lightning-bandlimit robustness`` after
            ``--config robustness``; default ``[--limit, "64", --heat_map_limit, "64"]`` (64 test
            images: a demonstration; the robustness recipe itself evaluates 256), e.g.
            ``'[--limit, "64"]'``.

    Raises:
        FileNotFoundError: for an unknown recipe (before any work).
        ValueError: for a co-tenant trace or budget fraction out of range, an output folder
            that cannot be created, or overrides the recipe rejects or that train no step or
            without end (all before any work).
        TypeError: for a number of the wrong type (before any work).
        RuntimeError: when a job fails (its log's tail in the message; earlier results kept).
        SanityCheckError: when a robustness sanity check fails (after everything is written).

    Returns:
        The run folder.
    """
    overrides = list(DEFAULT_OVERRIDES if overrides is None else overrides)
    ramp = _check_arguments(recipe, output_dir, overrides, cotenant_low_mib, cotenant_high_mib, budget_below)
    trace = asdict(ramp)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(output_dir).resolve() / f"main-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    started = time.perf_counter()

    print(
        f"[main] 1/3 full-spectrum job (plain nn.Conv2d) beside a co-tenant growing {cotenant_low_mib:.0f} "
        "-> "
        f"{cotenant_high_mib:.0f} MiB; log: {run_dir / 'full-spectrum' / 'job.log'}",
        flush=True,
    )
    plain = launch(
        JobSpec("full-spectrum", "plain", str(run_dir / "full-spectrum"), trace, recipe, overrides)
    )
    budget = budget_for(plain, ramp, below=budget_below)
    increment = plain.step_increment_bytes
    min_free, release_free = adaptive_thresholds(plain)
    print(
        f"[main] budget {budget / MIB:.0f} MiB: the plain job's step peak + the co-tenant's peak, less "
        f"{budget_below:.2f} x its step memory ({increment / MIB:.0f} MiB)",
        flush=True,
    )
    print(
        f"[main] 2/3 ladder job (AdaptiveBandLimit: checkpointing first, then compression from 0) on that "
        f"budget; log: {run_dir / 'ladder' / 'job.log'}",
        flush=True,
    )
    ladder = launch(
        JobSpec(
            "ladder",
            "adaptive",
            str(run_dir / "ladder"),
            trace,
            recipe,
            overrides,
            compression=0.0,
            max_compression=0.9,
            budget=budget,
            min_free=min_free,
            release_free=release_free,
            recalibrate_bn=RECALIBRATE_BN,
            levers=["checkpoint", "microbatch", "compression"],
        )
    )
    print(
        "[main] 3/3 band-limited job (compression-only AdaptiveBandLimit, floor: the recipe's compression) "
        f"on that budget; log: {run_dir / 'band-limited' / 'job.log'}",
        flush=True,
    )
    adaptive = launch(
        JobSpec(
            "band-limited",
            "adaptive",
            str(run_dir / "band-limited"),
            trace,
            recipe,
            overrides,
            compression=None,
            max_compression=0.9,
            budget=budget,
            min_free=min_free,
            release_free=release_free,
            recalibrate_bn=RECALIBRATE_BN,
            levers=["compression"],
        )
    )
    rows = [("full-spectrum", plain), ("ladder", ladder), ("band-limited", adaptive)]
    plot_timelines(
        [plain, ladder, adaptive],
        budget,
        run_dir / "timeline.png",
        title=f"{recipe}: plain vs the ladder vs compression-only beside a co-tenant",
    )
    training_s = time.perf_counter() - started
    summary = {
        "recipe": recipe,
        "run_dir": str(run_dir),
        "overrides": overrides,
        "budget_bytes": budget,
        "trace": trace,
        "min_free_bytes": min_free,
        "release_free_bytes": release_free,
        "host_allocator_env": HOST_ALLOCATOR_ENV,
        "results": [
            {
                "variant": v,
                **{k: x for k, x in asdict(r).items() if k != "timeline"},
                "over_budget_steps": over_budget(r, budget),
                "steps": len(r.timeline),
                "robustness": v != "ladder",
            }
            for v, r in rows
        ],
        "wall_s": training_s,
        "versions": {
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "python": platform.python_version(),
        },
        "threads": torch.get_num_threads(),
    }
    print()
    print(main_table(rows, budget))
    print(main_legend(budget, cotenant_low_mib, cotenant_high_mib, adaptive))
    verdict = main_verdict(plain, ladder, adaptive, budget)
    summary["verdict"] = verdict
    atomic_write_json(run_dir / SUMMARY_NAME, summary)
    print("\n".join(verdict))
    print(
        f"training wall time {training_s:.0f} s; timeline: {run_dir / 'timeline.png'}; run folder: {run_dir}"
    )
    if robustness:
        from lightning_bandlimit.recipes.robustness import main as evaluate

        print("\nrobustness: lightning-bandlimit robustness --config robustness --main_run " + str(run_dir))
        started = time.perf_counter()
        evaluate(
            [
                "--config",
                "robustness",
                "--main_run",
                str(run_dir),
                "--output_dir",
                str(run_dir / "robustness"),
                *(DEFAULT_ROBUSTNESS if robustness_overrides is None else robustness_overrides),
            ]
        )
        print(
            f"robustness wall time {time.perf_counter() - started:.0f} s; report: "
            f"{run_dir / 'robustness' / 'summary.md'}"
        )
    return run_dir


def _cli(args: list[str] | None = None) -> None:
    """``python -m lightning_bandlimit.jobs.main_job``: a bad argument ends in one line and exit 2."""
    from jsonargparse import auto_parser

    prog = "python -m lightning_bandlimit.jobs.main_job"
    parser = auto_parser(main, as_positional=False, exit_on_error=False, prog=prog)
    try:
        config = parser.parse_args(sys.argv[1:] if args is None else args)
        config.pop("config", None)
        kwargs = config.as_dict()
        _check_arguments(
            kwargs["recipe"],
            kwargs["output_dir"],
            list(DEFAULT_OVERRIDES if kwargs["overrides"] is None else kwargs["overrides"]),
            kwargs["cotenant_low_mib"],
            kwargs["cotenant_high_mib"],
            kwargs["budget_below"],
        )
    except (ArgumentError, ValueError, TypeError, FileNotFoundError) as error:
        if debugging():
            raise
        message = one_line_error(error) if isinstance(error, ArgumentError) else str(error)
        raise exit_with_error(prog, message) from None
    main(**kwargs)


if __name__ == "__main__":
    _cli()
