"""One model under every attack: clean pass, model-level sanity checks, attack runs, worst case.

Each run draws its randomness from its own seed
(:func:`~lightning_bandlimit.recipes.threats.derive_seed`) on a forked RNG. A minimum-norm
attack (``cw``) runs once and is evaluated at every budget: a sample counts as correct at
``eps`` when it is correct on the clean image and the attack found no misclassified example
within L2 distance ``eps``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_bandlimit.recipes.evaluation.evaluated_model import EvaluatedModel
from lightning_bandlimit.recipes.evaluation.evaluation_data import Batches
from lightning_bandlimit.recipes.evaluation.worst_case import AttackOutcome, worst_case
from lightning_bandlimit.recipes.results.records import RobustnessRecord
from lightning_bandlimit.recipes.results.result_store import ResultStore
from lightning_bandlimit.recipes.results.sanity import check_gradients, check_large_budget
from lightning_bandlimit.recipes.threats import (
    ATTACKS,
    AttackSpec,
    build_attack,
    derive_seed,
    spec_band,
    spec_band_name,
    spec_model_band,
    spec_norm,
)
from lightning_bandlimit.recipes.threats.input_band import BandSubspace

__all__ = ["RunContext", "evaluate_model", "frozen_parameters", "runs_per_model"]


@dataclass(frozen=True)
class RunContext:
    """What every model's runs share.

    Args:
        specs: the attacks.
        batches: the samples, on ``device``.
        seed: the evaluation seed.
        device: where the runs happen.
        sanity_samples: samples of the gradient and large-budget checks.
        subspaces: attack key -> the input-band subspace of a ``band: dropped | kept`` attack.
        band_sources: attack key -> the variant whose input band that attack uses.
        progress: the progress bar (``update(n)``, ``set_postfix_str(text, refresh=)``).
    """

    specs: Sequence[AttackSpec]
    batches: Batches
    seed: int
    device: torch.device
    sanity_samples: int
    subspaces: Mapping[str, BandSubspace]
    band_sources: Mapping[str, str]
    progress: Any


@dataclass(frozen=True)
class _AttackRun:
    """Per-sample results of one attack run on one model."""

    correct: torch.Tensor  # bool (n,)
    l2: torch.Tensor  # (n,)
    linf: torch.Tensor  # (n,)
    seconds: float
    seed: int


def runs_per_model(specs: Sequence[AttackSpec]) -> int:
    """Attack runs per model: one per budget, one in all for a minimum-norm attack."""
    return sum(1 if ATTACKS[s.name].minimum_norm else len(s.eps) for s in specs)


@contextlib.contextmanager
def frozen_parameters(modules: Iterable[nn.Module]) -> Iterator[None]:
    """``requires_grad=False`` on all parameters (attacks need input gradients only); restored after."""
    parameters = {id(p): p for m in modules for p in m.parameters()}
    flags = {key: p.requires_grad for key, p in parameters.items()}
    try:
        for p in parameters.values():
            p.requires_grad_(False)
        yield
    finally:
        for key, p in parameters.items():
            p.requires_grad_(flags[key])


@contextlib.contextmanager
def _seeded(device: torch.device, seed: int) -> Iterator[None]:
    """Seed torch's RNGs for one run, on a fork: the caller's RNG state is restored afterwards."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _run_attack(
    context: RunContext, model: EvaluatedModel, spec: AttackSpec, eps: float, run_seed: int
) -> _AttackRun:
    """Build the attack for ``eps`` and run it over all batches."""
    began = time.perf_counter()
    correct, l2, linf = [], [], []
    with _seeded(context.device, run_seed):
        attack = build_attack(
            spec,
            model.module,
            eps,
            num_classes=model.num_classes,
            seed=run_seed,
            subspace=context.subspaces.get(spec.key),
        )
        for x, y in context.batches:
            adv = attack(x, y)
            if not isinstance(adv, torch.Tensor) or adv.shape != x.shape:
                got = tuple(adv.shape) if isinstance(adv, torch.Tensor) else type(adv).__name__
                raise RuntimeError(
                    f"attack {spec.key!r} returned {got}, expected images of shape {tuple(x.shape)}"
                )
            adv = adv.detach().to(x.device)
            with torch.no_grad():
                correct.append((model.module(adv).argmax(1) == y).cpu())
                delta = (adv - x).flatten(1)
                l2.append(delta.norm(dim=1).cpu())
                linf.append(delta.abs().amax(dim=1).cpu())
            context.progress.update(1)
    return _AttackRun(
        torch.cat(correct), torch.cat(l2), torch.cat(linf), time.perf_counter() - began, run_seed
    )


def _record(
    context: RunContext,
    model: EvaluatedModel,
    spec: AttackSpec,
    eps: float,
    clean: torch.Tensor,
    run: _AttackRun,
) -> RobustnessRecord:
    info = ATTACKS[spec.name]
    radial_band = spec_band(spec)
    return RobustnessRecord(
        model=model.name,
        attack=spec.key,
        attack_name=spec.name,
        threat=info.threat,
        norm=spec_norm(spec),
        eps=eps,
        band=list(radial_band) if radial_band else None,
        band_name=spec_band_name(spec) or spec_model_band(spec),
        iterative=info.iterative,
        n=len(clean),
        clean_correct=int(clean.sum()),
        robust_correct=int(run.correct.sum()),
        flipped=int((run.correct != clean).sum()),
        clean_accuracy=float(clean.double().mean()),
        robust_accuracy=float(run.correct.double().mean()),
        mean_l2=float(run.l2.double().mean()),
        mean_linf=float(run.linf.double().mean()),
        max_l2=float(run.l2.float().max()),
        max_linf=float(run.linf.float().max()),
        seconds=run.seconds,
        seed=run.seed,
        variant=model.variant,
        replicate=model.replicate,
        band_source=context.band_sources.get(spec.key),
    )


def _at_budget(run: _AttackRun, clean: torch.Tensor, eps: float) -> _AttackRun:
    """A minimum-norm run read at budget ``eps``: examples farther than ``eps`` do not count."""
    inside = run.l2 <= eps
    return _AttackRun(
        clean & (run.correct | ~inside),
        torch.where(inside, run.l2, 0.0),
        torch.where(inside, run.linf, 0.0),
        run.seconds,
        run.seed,
    )


def _runs(
    context: RunContext, model: EvaluatedModel, spec: AttackSpec, clean: torch.Tensor
) -> Iterator[tuple[float, _AttackRun]]:
    """``(eps, run)`` for every budget of ``spec``."""
    if ATTACKS[spec.name].minimum_norm:
        context.progress.set_postfix_str(f"{model.name} {spec.key}", refresh=False)
        run = _run_attack(context, model, spec, max(spec.eps), derive_seed(context.seed, spec.key))
        for eps in spec.eps:
            yield eps, _at_budget(run, clean, eps)
        return
    for eps in spec.eps:
        context.progress.set_postfix_str(f"{model.name} {spec.key} eps={eps:.4g}", refresh=False)
        yield eps, _run_attack(context, model, spec, eps, derive_seed(context.seed, spec.key, eps))


def evaluate_model(model: EvaluatedModel, context: RunContext, store: ResultStore) -> None:
    """Run every attack on one model; add its sanity checks, records and worst cases to ``store``.

    The store is saved after the sanity checks, after every record and after the worst case.
    """
    module = model.module
    with torch.no_grad():
        clean = torch.cat([(module(x).argmax(1) == y).cpu() for x, y in context.batches])
    probe_x = torch.cat([x for x, _ in context.batches])[: context.sanity_samples]
    probe_y = torch.cat([y for _, y in context.batches])[: context.sanity_samples]
    store.sanity_checks.append(check_gradients(module, probe_x, probe_y, name=model.name))
    store.sanity_checks.append(
        check_large_budget(
            module,
            probe_x,
            probe_y,
            num_classes=model.num_classes,
            seed=derive_seed(context.seed, "large_budget"),
            name=model.name,
        )
    )
    store.save()
    outcomes: list[AttackOutcome] = []
    for spec in context.specs:
        for eps, run in _runs(context, model, spec, clean):
            store.add_record(_record(context, model, spec, eps, clean, run))
            outcomes.append(AttackOutcome(spec, spec_norm(spec), eps, run.correct))
    store.worst_case.extend(
        worst_case(
            model.name,
            clean,
            outcomes,
            context.band_sources,
            variant=model.variant,
            replicate=model.replicate,
        )
    )
    store.save()
