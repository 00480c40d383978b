"""``evaluate_robustness``: plan, run every model, check, draw, summarise (see :mod:`.robustness`).

The evaluation is a short sequence over small pieces: :func:`~.plan.plan_evaluation` checks and
resolves everything before any work, :class:`~.result_store.ResultStore` writes the results
after every record, :func:`~.model_runner.evaluate_model` runs one model under every attack,
and the report's plot, heat maps and summary close the run.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from lightning_bandlimit.recipes.evaluation.attack_subspaces import band_limited_variants
from lightning_bandlimit.recipes.evaluation.loading import Source
from lightning_bandlimit.recipes.evaluation.model_runner import (
    RunContext,
    evaluate_model,
    frozen_parameters,
    runs_per_model,
)
from lightning_bandlimit.recipes.evaluation.plan import EvaluationPlan, plan_evaluation
from lightning_bandlimit.recipes.results.records import RobustnessRecord, WorstCaseRecord
from lightning_bandlimit.recipes.results.report import plot_accuracy_vs_eps, summary_markdown
from lightning_bandlimit.recipes.results.result_store import ResultStore
from lightning_bandlimit.recipes.results.sanity import (
    SanityCheck,
    SanityCheckError,
    check_budget,
    check_eps_zero,
    check_monotonic,
)
from lightning_bandlimit.recipes.results.verdict import study_markdown
from lightning_bandlimit.recipes.threats import AttackSpec
from lightning_bandlimit.utils.files import atomic_write

__all__ = ["RobustnessReport", "evaluate_robustness", "run_plan"]


@dataclass
class RobustnessReport:
    """What :func:`evaluate_robustness` produced.

    Args:
        output_dir: the output folder.
        records: one record per model x attack x eps (x band).
        worst_case: per-sample worst cases (full-spectrum robust accuracy, band-restricted).
        sanity_checks: all sanity checks.
        paths: the files written, by kind (``results_json``, ``results_csv``, ``plot``,
            ``summary``, ``heat_map_png:<model>``, ``heat_map_npy:<model>``).
        summary: the Markdown summary (the content of ``summary.md``).
    """

    output_dir: Path
    records: list[RobustnessRecord]
    worst_case: list[WorstCaseRecord]
    sanity_checks: list[SanityCheck]
    paths: dict[str, Path] = field(default_factory=dict)
    summary: str = ""

    @property
    def passed(self) -> bool:
        """Whether every sanity check passed."""
        return all(c.passed for c in self.sanity_checks)

    @property
    def failed_checks(self) -> list[SanityCheck]:
        """The sanity checks that failed."""
        return [c for c in self.sanity_checks if not c.passed]


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "model"


def _record_level_checks(plan: EvaluationPlan, store: ResultStore) -> None:
    for model in plan.models:
        store.sanity_checks.append(check_eps_zero(store.records, model=model.name))
        store.sanity_checks.append(check_monotonic(store.records, model=model.name))
        store.sanity_checks.append(check_budget(store.records, model=model.name))
    names = [m.name for m in plan.models]
    store.sanity_checks.sort(key=lambda c: names.index(c.model) if c.model in names else -1)  # stable
    store.save()


def _heat_maps(plan: EvaluationPlan, store: ResultStore) -> dict[str, torch.Tensor]:
    """Each model's Fourier heat map, saved as PNG and NPY; model name -> the map (on CPU)."""
    from lightning_bandlimit.recipes.evaluation.fourier_heatmap import fourier_heat_map, save_heat_map

    images = torch.cat([x for x, _ in plan.batches])[: plan.heat_map_limit]
    labels = torch.cat([y for _, y in plan.batches])[: plan.heat_map_limit]
    grids: dict[str, torch.Tensor] = {}
    for model in plan.models:
        begun = time.perf_counter()
        grid = fourier_heat_map(
            model.module, images, labels, eps=plan.heat_map_eps, seed=plan.seed, progress=plan.progress
        )
        stem = plan.output_dir / f"heat_map_{_safe_name(model.name)}"
        png, npy = stem.with_suffix(".png"), stem.with_suffix(".npy")
        save_heat_map(grid, png, npy, title=f"{model.name} (L2 {plan.heat_map_eps:g})")
        grids[model.name] = grid.cpu()
        store.paths[f"heat_map_png:{model.name}"], store.paths[f"heat_map_npy:{model.name}"] = png, npy
        store.heat_maps.append(
            {
                "model": model.name,
                "png": png.name,
                "npy": npy.name,
                "eps": plan.heat_map_eps,
                "n": len(labels),
                "mean_error": float(grid.float().mean()),
                "seconds": time.perf_counter() - begun,
            }
        )
        store.save()
    return grids


def _heat_map_difference(
    plan: EvaluationPlan, grids: Mapping[str, torch.Tensor], limited: str, full: str
) -> Path:
    """Mean heat map per variant, and the band-limited minus full-spectrum difference with the kept box."""
    from lightning_bandlimit.recipes.evaluation.fourier_heatmap import save_heat_map_difference

    means = {
        variant: torch.stack([grids[m.name] for m in plan.models if m.variant == variant]).mean(0)
        for variant in (limited, full)
    }
    band = next(m.input_band for m in plan.models if m.variant == limited)
    assert band is not None
    path = plan.output_dir / "heat_map_difference.png"
    save_heat_map_difference(
        means[limited],
        means[full],
        path,
        names=(limited, full),
        box=band.box,
        title=(
            f"Fourier heat maps, L2 {plan.heat_map_eps:g} (mean over replicates); box: what {limited}'s "
            f"input layer {band.layer!r} keeps at compression {band.compression:.3g}"
        ),
    )
    return path


def _compared_pair(plan: EvaluationPlan) -> tuple[str | None, str | None]:
    """(the band-limited variant, the other) when there is exactly one of each."""
    limited = band_limited_variants(plan.models)
    others = [v for v in dict.fromkeys(m.variant for m in plan.models) if v not in limited]
    return (limited[0], others[0]) if len(limited) == 1 and len(others) == 1 else (None, None)


def _summary(plan: EvaluationPlan, store: ResultStore, pair: tuple[str | None, str | None]) -> str:
    notes = [
        (
            f"{len(plan.models)} model(s), {plan.n_samples} test samples each, seed {plan.seed}, device "
            f"{plan.device}, {datetime.datetime.now().isoformat(timespec='seconds')}"
        ),
        "Models: " + "; ".join(f"{m.name} ({m.note()})" for m in plan.models),
    ]
    return (
        summary_markdown(store.records, store.worst_case, store.sanity_checks, notes=notes)
        + "\n"
        + study_markdown(store.records, store.worst_case, *pair)
    )


def run_plan(plan: EvaluationPlan) -> RobustnessReport:
    """Carry out a checked plan: create the output folder, evaluate, write everything.

    Must run with gradients enabled and outside inference mode (as
    :func:`evaluate_robustness` arranges).

    Raises:
        SanityCheckError: if ``plan.strict`` and a sanity check failed (outputs are written first).
    """
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    store = ResultStore(
        plan.output_dir,
        seed=plan.seed,
        n_samples=plan.n_samples,
        config=plan.config(),
        started=plan.started,
        began=plan.began,
    )
    bar = tqdm(
        total=len(plan.models) * runs_per_model(plan.specs) * len(plan.batches),
        desc="robustness",
        unit="batch",
        disable=not plan.progress,
        dynamic_ncols=True,
    )
    context = RunContext(
        plan.specs,
        plan.batches,
        plan.seed,
        plan.device,
        plan.sanity_samples,
        plan.subspaces,
        plan.band_sources,
        bar,
    )
    try:
        store.save()
        with frozen_parameters(m.module for m in plan.models):
            for model in plan.models:
                evaluate_model(model, context, store)
            bar.close()
            _record_level_checks(plan, store)
            grids = _heat_maps(plan, store) if plan.heat_map else {}
        pair = _compared_pair(plan)
        if plan.heat_map and pair[0] is not None and pair[1] is not None:
            store.paths["heat_map_difference"] = _heat_map_difference(plan, grids, pair[0], pair[1])
        summary = _summary(plan, store, pair)
        store.paths["plot"] = plot_accuracy_vs_eps(
            store.records,
            plan.output_dir / "accuracy_vs_eps.png",
            title=f"accuracy vs eps ({plan.n_samples} samples, seed {plan.seed})",
        )
        store.paths["summary"] = atomic_write(plan.output_dir / "summary.md", summary)
    except BaseException as error:
        bar.close()
        with contextlib.suppress(Exception):  # the original error matters more than a failed save
            store.fail(error)
        raise
    store.complete()
    report = RobustnessReport(
        plan.output_dir, store.records, store.worst_case, store.sanity_checks, store.paths, summary
    )
    if plan.strict and not report.passed:
        raise SanityCheckError(report.failed_checks, str(plan.output_dir))
    return report


def evaluate_robustness(
    models: Mapping[str, Source | Sequence[Source]],
    data: pl.LightningDataModule | DataLoader,
    attacks: Sequence[AttackSpec | Mapping[str, Any]],
    output_dir: str | Path,
    *,
    limit: int | None = None,
    seed: int = 0,
    device: str = "auto",
    heat_map: bool = True,
    heat_map_eps: float = 4.0,
    heat_map_limit: int | None = 256,
    strict: bool = True,
    progress: bool = True,
    overwrite: bool = False,
    sanity_samples: int = 32,
) -> RobustnessReport:
    """Evaluate classifiers side by side under attacks; write the report (see :mod:`.robustness`).

    Args:
        models: name -> an ``nn.Module`` in eval mode (images in ``[0, 1]`` -> logits) or an
            ``ImageClassifier`` checkpoint path (see :func:`load_classifier`), or a list of them:
            the replicates of one variant (e.g. one checkpoint per training seed), evaluated each
            as ``name#i`` and reported as mean +- std with paired differences between variants.
        data: a LightningDataModule (its test set) or a DataLoader of ``(images, labels)``.
        attacks: the attacks (:class:`~lightning_bandlimit.recipes.threats.AttackSpec` or
            mappings of its fields), each with its list of budgets.
        output_dir: the output folder (created).
        limit: evaluate the first ``limit`` samples only.
        seed: the evaluation seed.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ...
        heat_map: compute each model's Fourier heat map.
        heat_map_eps: the L2 norm of the heat map's Fourier-basis perturbations.
        heat_map_limit: samples used for the heat map (``None``: all evaluated samples).
        strict: raise :class:`SanityCheckError` (after writing everything) if a check failed.
        progress: show a progress bar over models x attack runs x batches.
        overwrite: replace an existing ``results.json`` in ``output_dir``.
        sanity_samples: samples of the model-level sanity checks (gradients, large budget).

    Returns:
        The :class:`RobustnessReport`.

    Raises:
        ValueError: for invalid inputs (see :mod:`.plan`), before any work.
        FileNotFoundError: for a missing checkpoint.
        FileExistsError: if ``output_dir`` holds a ``results.json`` and ``overwrite`` is false.
        TypeError: for ``data`` of another type, or an option of the wrong type.
        SanityCheckError: if ``strict`` and a sanity check failed (outputs are written first).

    Example:
        >>> import tempfile
        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <...>
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(48, 3)).eval()
        >>> images = torch.rand(16, 3, 4, 4)
        >>> loader = DataLoader(TensorDataset(images, model(images).argmax(1)), batch_size=8)
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     report = evaluate_robustness(
        ...         {"linear": model}, loader, [AttackSpec("fgsm", eps=[0, 0.1])], folder,
        ...         heat_map=False, progress=False, strict=False)
        >>> [(r.attack, r.eps, r.clean_accuracy, r.n) for r in report.records]
        [('fgsm', 0.0, 1.0, 16), ('fgsm', 0.1, 1.0, 16)]
        >>> [c.name for c in report.sanity_checks if c.passed]
        ['gradients', 'large_budget', 'eps_zero', 'monotonic', 'budget']
    """
    with torch.inference_mode(False), torch.enable_grad():
        plan = plan_evaluation(
            models,
            data,
            attacks,
            output_dir,
            limit=limit,
            seed=seed,
            device=device,
            heat_map=heat_map,
            heat_map_eps=heat_map_eps,
            heat_map_limit=heat_map_limit,
            strict=strict,
            progress=progress,
            overwrite=overwrite,
            sanity_samples=sanity_samples,
        )
        return run_plan(plan)
