"""The plan of a robustness evaluation: every input checked and resolved before any work.

:func:`plan_evaluation` validates the options, loads the models, reads the data, probes every
model once (eval mode, ``(N, classes)`` finite logits that are not probabilities, labels in
range, a gradient path to the input when gradient attacks run), derives the input bands that
``band: dropped | kept`` attacks use, and builds every attack once (which surfaces bad option
values). Nothing is written until it returns.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_bandlimit.layers.surgery import bandlimited_layers
from lightning_bandlimit.recipes.evaluation.attack_subspaces import (
    derive_input_bands,
    resolve_attack_subspaces,
)
from lightning_bandlimit.recipes.evaluation.evaluated_model import EvaluatedModel, replicates
from lightning_bandlimit.recipes.evaluation.evaluation_data import Batches, describe_data, read_batches
from lightning_bandlimit.recipes.evaluation.loading import Source, load_source, resolve_device
from lightning_bandlimit.recipes.threats import (
    ATTACKS,
    AttackSpec,
    Threat,
    build_attack,
    spec_band,
    spec_norm,
    spec_options,
    validate_attack_specs,
)
from lightning_bandlimit.recipes.threats.input_band import BandSubspace
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["EvaluationPlan", "plan_evaluation"]


@dataclass(frozen=True)
class EvaluationPlan:
    """What an evaluation will do, all of it checked.

    Args:
        models: the evaluated models (probed, with their input bands).
        specs: the validated attacks.
        batches: the samples, on ``device``.
        device: where everything runs.
        output_dir: the output folder (not created yet).
        subspaces: attack key -> the input-band subspace of a ``band: dropped | kept`` attack.
        band_sources: attack key -> the variant whose input band that attack uses.
        data_description: what ``results.json`` records about the data.
        seed: the evaluation seed.
        limit: the sample limit (``None``: all).
        heat_map: whether to compute Fourier heat maps.
        heat_map_eps: their perturbation's L2 norm.
        heat_map_limit: samples they use (``None``: all).
        strict: whether a failed sanity check raises.
        progress: whether to show a progress bar.
        sanity_samples: samples of the model-level sanity checks.
        started: when planning began (ISO time).
        began: ``time.perf_counter()`` then.
    """

    models: list[EvaluatedModel]
    specs: list[AttackSpec]
    batches: Batches
    device: torch.device
    output_dir: Path
    subspaces: dict[str, BandSubspace]
    band_sources: dict[str, str]
    data_description: dict[str, Any]
    seed: int
    limit: int | None
    heat_map: bool
    heat_map_eps: float
    heat_map_limit: int | None
    strict: bool
    progress: bool
    sanity_samples: int
    started: str
    began: float

    @property
    def n_samples(self) -> int:
        """Samples evaluated per model."""
        return sum(len(labels) for _, labels in self.batches)

    def config(self) -> dict[str, Any]:
        """The resolved configuration, as ``results.json`` records it."""
        return {
            "models": {m.name: _model_config(m) for m in self.models},
            "data": self.data_description,
            "attacks": [
                {
                    **asdict(s),
                    "key": s.key,
                    "norm": spec_norm(s),
                    "threat": ATTACKS[s.name].threat,
                    "band_resolved": spec_band(s),
                    "band_source": self.subspaces[s.key].band.describe() if s.key in self.subspaces else None,
                    "options_resolved": spec_options(s),
                }
                for s in self.specs
            ],
            "limit": self.limit,
            "device": str(self.device),
            "heat_map": self.heat_map,
            "heat_map_eps": self.heat_map_eps,
            "heat_map_limit": self.heat_map_limit,
            "strict": self.strict,
            "sanity_samples": self.sanity_samples,
        }


def _model_config(m: EvaluatedModel) -> dict[str, Any]:
    band = m.input_band
    return {
        "source": m.loaded.source,
        "class": type(m.module).__name__,
        "num_classes": m.num_classes,
        "band_limit": m.loaded.band_limit_states,
        "band_limited_layers": sum(1 for _ in bandlimited_layers(m.module)),
        "variant": m.variant,
        "replicate": m.replicate,
        "input_band": None
        if band is None
        else {
            "layer": band.layer,
            "compression": band.compression,
            "kept_dims": band.kept.dims,
            "dropped_dims": band.dropped.dims,
            "box_cycles_per_pixel": list(band.box),
        },
    }


def _check_logits(name: str, output: Any, n: int, labels: torch.Tensor) -> int:
    """Validate a probe output of ``n`` rows against all ``labels``; return the number of classes."""
    expected = f"expected logits of shape (N, classes) = ({n}, classes >= 2)"
    if not isinstance(output, torch.Tensor):
        raise ValueError(f"model {name!r}: {expected}, got {type(output).__name__}")
    if output.dim() != 2 or output.shape[0] != n or output.shape[1] < 2:
        raise ValueError(f"model {name!r}: {expected}, got shape {tuple(output.shape)}")
    if not output.is_floating_point():
        raise ValueError(f"model {name!r}: {expected} as floats, got dtype {output.dtype}")
    if not bool(output.isfinite().all()):
        raise ValueError(f"model {name!r}: {expected} with finite values, got NaN or inf")
    if bool((output >= 0).all()) and bool(((output.sum(1) - 1).abs() < 1e-4).all()):
        raise ValueError(
            f"model {name!r}: {expected}, got rows that are non-negative and sum to 1 (probabilities): "
            "remove the final softmax, attacks need logits"
        )
    classes = output.shape[1]
    if int(labels.min()) < 0 or int(labels.max()) >= classes:
        raise ValueError(
            f"model {name!r}: expected labels in [0, {classes}) for its {classes} logits, got labels in "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    return classes


def _differentiable(module: nn.Module, images: torch.Tensor) -> bool:
    """Whether the logits have a gradient path to the input (a zero gradient still counts)."""
    x = images[:2].detach().clone().requires_grad_(True)
    logits = module(x)
    if not isinstance(logits, torch.Tensor) or not logits.requires_grad:
        return False
    (grad,) = torch.autograd.grad(logits.sum(), x, allow_unused=True)
    return grad is not None


def _check_output_dir(output_dir: str | Path, overwrite: bool) -> Path:
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"expected output_dir to be a folder, got the file {str(output_dir)!r}")
    existing = output_dir / "results.json"
    if existing.is_file() and existing.stat().st_size > 0 and not overwrite:
        raise FileExistsError(
            f"{str(existing)!r} exists: pass overwrite=True (--overwrite true) or choose another output_dir"
        )
    return output_dir


def _check_model_names(models: Any) -> None:
    if not isinstance(models, Mapping) or not models:
        raise ValueError(f"expected a non-empty mapping of name -> model or checkpoint path, got {models!r}")
    for name in models:
        if not isinstance(name, str) or not name:
            raise ValueError(f"expected non-empty model names, got {name!r}")


def _load_models(
    models: Mapping[str, Source | Sequence[Source]], device: torch.device
) -> list[EvaluatedModel]:
    evaluated = []
    for name, variant, replicate, source in replicates(models):
        loaded = load_source(source, device)
        if any(p.is_inference() for p in loaded.module.parameters()):
            raise ValueError(
                f"model {name!r}: expected ordinary parameters, got parameters created under "
                "torch.inference_mode (they cannot take part in autograd); build the model outside it"
            )
        evaluated.append(EvaluatedModel(name, loaded, variant=variant, replicate=replicate))
    return evaluated


def _probe(
    evaluated: Sequence[EvaluatedModel], batches: Batches, device: torch.device, gradients: bool
) -> None:
    """Check every model on the first batch; set its number of classes."""
    probe_x, probe_y = (t.to(device) for t in batches[0])
    all_labels = torch.cat([labels for _, labels in batches])
    for model in evaluated:
        with torch.no_grad():
            output = model.module(probe_x)
        model.num_classes = _check_logits(model.name, output, len(probe_y), all_labels)
        if gradients and not _differentiable(model.module, probe_x):
            raise ValueError(
                f"model {model.name!r}: expected logits that depend differentiably on the input for "
                "gradient-based attacks, got none (argmax, detach or no_grad inside the model?); wrap "
                "non-differentiable parts in a straight-through estimator (BPDA) or run noise attacks only"
            )


def plan_evaluation(
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
) -> EvaluationPlan:
    """Check and resolve everything an evaluation needs (see the module docstring); write nothing.

    Arguments as :func:`~lightning_bandlimit.recipes.evaluation.evaluate.evaluate_robustness`; must run
    with gradients enabled and outside inference mode.

    Raises:
        ValueError: for invalid inputs.
        TypeError: for a value of the wrong type, or ``data`` of another type.
        FileNotFoundError: for a missing checkpoint.
        FileExistsError: if ``output_dir`` holds a ``results.json`` and ``overwrite`` is false.
    """
    started, began = datetime.datetime.now().isoformat(timespec="seconds"), time.perf_counter()
    _check_model_names(models)
    specs = validate_attack_specs(
        list(attacks) if not isinstance(attacks, (Mapping, AttackSpec)) else attacks
    )
    for name, value in (
        ("limit", limit),
        ("heat_map_limit", heat_map_limit),
        ("sanity_samples", sanity_samples),
    ):
        if value is not None:
            check_int(name, value, minimum=1)
    check_real("heat_map_eps", heat_map_eps, minimum=0, min_open=True)
    target = resolve_device(device)
    output_dir = _check_output_dir(output_dir, overwrite)
    evaluated = _load_models(models, target)
    batches = read_batches(data, limit, seed)
    _probe(evaluated, batches, target, gradients=any(ATTACKS[s.name].threat != Threat.NOISE for s in specs))
    derive_input_bands(evaluated, batches[0][0].to(target))
    subspaces, band_sources = resolve_attack_subspaces(specs, evaluated)
    for model in evaluated:
        for spec in specs:  # construction only: surfaces bad option values
            for eps in spec.eps:
                build_attack(
                    spec,
                    model.module,
                    eps,
                    num_classes=model.num_classes,
                    seed=0,
                    subspace=subspaces.get(spec.key),
                )
    return EvaluationPlan(
        models=evaluated,
        specs=specs,
        batches=[(x.to(target), y.to(target)) for x, y in batches],
        device=target,
        output_dir=output_dir,
        subspaces=subspaces,
        band_sources=band_sources,
        data_description=describe_data(data, sum(len(y) for _, y in batches), len(batches)),
        seed=seed,
        limit=limit,
        heat_map=heat_map,
        heat_map_eps=heat_map_eps,
        heat_map_limit=heat_map_limit,
        strict=strict,
        progress=progress,
        sanity_samples=sanity_samples,
        started=started,
        began=began,
    )
