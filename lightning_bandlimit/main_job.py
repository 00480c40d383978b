"""The main job: train a recipe band-limited and as a full-spectrum twin, compare them.

``python -m lightning_bandlimit.main_job`` (README command 1) trains the ``quickstart`` recipe
twice, once band-limited and once with plain convolutions, prints a side-by-side summary, then
evaluates both checkpoints under attack with the ``robustness`` recipe (``lightning-bandlimit
robustness --config robustness``) and prints its summary table; everything goes into one run
folder. In the band-limited run the recipe's ``BandLimit``
becomes an :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` whose floor is the
recipe's compression: with room to spare it changes nothing, and when the machine's memory runs
short (another job grows) it raises the compression instead of letting the job fail::

    runs/main-<timestamp>/
        band-limited/    checkpoints, metrics.csv, config.yaml
        full-spectrum/   the same for the twin
        summary.json     the summary table, versions, wall times
        robustness/      results.json/.csv, accuracy_vs_eps.png, heat maps, summary.md
"""

from __future__ import annotations

import copy
import datetime
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning
import torch

from lightning_bandlimit.callbacks import AdaptiveBandLimit, BandLimit, StepTimer
from lightning_bandlimit.cli import BandLimitCLI, recipe_path
from lightning_bandlimit.saved_tensors import saved_activation_bytes

__all__ = ["VariantResult", "main", "train_variant"]


@dataclass
class VariantResult:
    """One row of the summary."""

    variant: str
    val_accuracy: float
    compression: float
    achieved_compression: float
    saved_activation_mib: float
    saved_vs_full_spectrum: float
    step_ms: float
    compression_changes: int
    wall_s: float
    checkpoint: str
    log_dir: str


def _saved_mib(model: torch.nn.Module, batch: torch.Tensor) -> float:
    """MiB the whole model saves for backward in one training forward."""
    probe = copy.deepcopy(model).train()  # a copy: the forward moves BatchNorm statistics
    return saved_activation_bytes(probe, batch) / 2**20


def train_variant(
    recipe: str, out_dir: Path, band_limited: bool, overrides: list[str]
) -> VariantResult:
    """Train one variant of ``recipe`` into ``out_dir`` and measure it.

    Args:
        recipe: recipe name or config path.
        out_dir: where checkpoints and logs go.
        band_limited: keep the recipe's ``BandLimit`` callbacks (``False``: plain convolutions).
        overrides: extra LightningCLI arguments (e.g. ``["--trainer.max_epochs", "2"]``).

    Raises:
        FileNotFoundError: for an unknown recipe.
    """
    args = [
        "--config", str(recipe_path(recipe)),
        "--trainer.default_root_dir", str(out_dir),
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir", str(out_dir),
        "--trainer.logger.name", "",
        *overrides,
    ]
    cli = BandLimitCLI(args=args, run=False)
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    # trainer.callbacks is a plain list: drop the band-limiting, or make it memory-aware.
    recipe_bands = [cb for cb in trainer.callbacks if type(cb) is BandLimit]
    trainer.callbacks[:] = [cb for cb in trainer.callbacks if type(cb) is not BandLimit]
    if band_limited:
        trainer.callbacks.extend(
            AdaptiveBandLimit(
                compression=cb.compression, min_compression=cb.compression, include=cb.include,
                exclude=cb.exclude, pointwise=cb.pointwise,
            )
            for cb in recipe_bands
        )
    timer = StepTimer()
    trainer.callbacks.append(timer)
    band = next((cb for cb in trainer.callbacks if isinstance(cb, BandLimit)), None)

    started = time.perf_counter()
    trainer.fit(model, datamodule=data)
    wall = time.perf_counter() - started

    images = next(iter(data.train_dataloader()))[0]
    saved_total = _saved_mib(model, images)
    checkpoint = trainer.checkpoint_callback
    return VariantResult(
        variant="band-limited" if band_limited else "full-spectrum",
        val_accuracy=float(trainer.callback_metrics.get("val/acc", float("nan"))),
        compression=band.compression if band else 0.0,
        achieved_compression=(band.achieved_compression or 0.0) if band else 0.0,
        saved_activation_mib=saved_total,
        saved_vs_full_spectrum=float("nan"),  # set once both variants ran
        step_ms=timer.median_ms or float("nan"),
        compression_changes=sum(
            a["compression"] != b["compression"] for a, b in zip(band.decisions, band.decisions[1:])
        ) if isinstance(band, AdaptiveBandLimit) else 0,
        wall_s=wall,
        checkpoint=getattr(checkpoint, "last_model_path", "") or getattr(checkpoint, "best_model_path", ""),
        log_dir=str(trainer.log_dir),
    )


def _table(results: list[VariantResult]) -> str:
    header = (
        f"{'variant':<14} {'val acc':>7} {'compression':>11} {'achieved':>8} {'saved act. MiB':>14} "
        f"{'x full-spec.':>12} {'step ms':>8} {'c changes':>9} {'wall s':>7}"
    )
    rows = [
        f"{r.variant:<14} {r.val_accuracy:>7.3f} {r.compression:>11.2f} {r.achieved_compression:>8.3f} "
        f"{r.saved_activation_mib:>14.2f} {r.saved_vs_full_spectrum:>12.2f} {r.step_ms:>8.1f} "
        f"{r.compression_changes:>9} {r.wall_s:>7.1f}"
        for r in results
    ]
    return "\n".join([header, *rows])


def main(
    recipe: str = "quickstart",
    output_dir: str = "runs",
    overrides: list[str] | None = None,
    robustness: bool = True,
    robustness_overrides: list[str] | None = None,
) -> Path:
    """Train ``recipe`` band-limited and full-spectrum, compare them, evaluate them under attack.

    Args:
        recipe: recipe name (``lightning-bandlimit recipes``) or a config path.
        output_dir: parent of the run folder ``main-<timestamp>``.
        overrides: LightningCLI arguments applied to both runs, e.g.
            ``'[--trainer.max_epochs, "2"]'``.
        robustness: run the ``robustness`` recipe on both checkpoints at the end.
        robustness_overrides: arguments for ``lightning-bandlimit robustness`` after
            ``--config robustness``, e.g. ``'[--limit, "64"]'``.

    Raises:
        FileNotFoundError: for an unknown recipe (before any work).
        SanityCheckError: when a robustness sanity check fails (after everything is written).

    Returns:
        The run folder.
    """
    recipe_path(recipe)  # fail before any work on an unknown recipe
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(output_dir).resolve() / f"main-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    started = time.perf_counter()
    results = [
        train_variant(recipe, run_dir / name, band_limited, list(overrides or []))
        for name, band_limited in (("band-limited", True), ("full-spectrum", False))
    ]
    for result in results:
        result.saved_vs_full_spectrum = result.saved_activation_mib / results[-1].saved_activation_mib
    summary = {
        "recipe": recipe,
        "run_dir": str(run_dir),
        "overrides": list(overrides or []),
        "results": [asdict(r) for r in results],
        "wall_s": time.perf_counter() - started,
        "versions": {
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "python": platform.python_version(),
        },
        "threads": torch.get_num_threads(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print()
    print(_table(results))
    print(
        "saved act. MiB: what autograd keeps for backward in one training forward (unique storages,\n"
        "parameters excluded; band-limited with memory-lean training, the default); x full-spec.:\n"
        "relative to the full-spectrum (plain nn.Conv2d) run; step ms: median training step;\n"
        "c changes: compression moves made by AdaptiveBandLimit (memory pressure on this machine).\n"
        "Whole-model memory per compression: python benchmarks/model_memory.py (README)."
    )
    print(f"training wall time {summary['wall_s']:.0f} s; run folder: {run_dir}")
    if robustness:
        from lightning_bandlimit.recipes.robustness import main as evaluate

        print("\nrobustness: lightning-bandlimit robustness --config robustness --main_run " + str(run_dir))
        started = time.perf_counter()
        evaluate([
            "--config", "robustness", "--main_run", str(run_dir), "--output_dir", str(run_dir / "robustness"),
            *(robustness_overrides or []),
        ])
        print(f"robustness wall time {time.perf_counter() - started:.0f} s; report: {run_dir / 'robustness' / 'summary.md'}")
    return run_dir


def _cli() -> None:
    from jsonargparse import CLI

    CLI(main, as_positional=False)


if __name__ == "__main__":
    _cli()
