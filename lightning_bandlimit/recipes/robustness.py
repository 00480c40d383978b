"""Robustness recipe: classifiers side by side under a suite of attacks, with sanity checks.

``lightning-bandlimit robustness --config robustness`` (or :func:`evaluate_robustness` from
Python) evaluates one or more classifiers (checkpoints of our
:class:`~lightning_bandlimit.models.ImageClassifier`, re-band-limited as they were trained, or
any ``nn.Module`` mapping ``[0, 1]`` images to logits) on a datamodule's test set under the
attacks of :mod:`~lightning_bandlimit.recipes.attack_suite`, at every budget of each attack's
``eps`` list, and writes::

    <output_dir>/
        results.json        one record per model x attack x eps (x band), worst case, sanity
                            checks, library versions, seed, config; rewritten after every record
        results.csv         the records
        accuracy_vs_eps.png one panel per attack, one curve per model
        heat_map_<model>.png / .npy   Fourier heat maps (Yin et al. 2019)
        summary.md          the tables, the sanity checks, which rows measure robustness

How results are counted:

* **accuracy under attack** (per record): the fraction of samples the model classifies
  correctly on the attack's output. For the minimum-norm ``cw`` attack at budget ``eps``: a
  sample is correct when it is correct on the clean image and the attack found no
  misclassified example within L2 distance ``eps``.
* **robust accuracy** (worst case): for each model, norm and budget, the fraction of samples
  correct on the clean image *and* under **every** full-spectrum white-box attack at that norm
  and budget (RobustBench's per-sample worst case). Band-restricted attacks get their own worst
  case, reported apart and labelled as not measuring robustness: a band-limited model ignores
  frequencies outside its band, so attacks confined to them fail trivially.
* perturbation norms are per-sample L2 and L-inf norms of ``adv - clean``, averaged over all
  samples (unperturbed ones count as 0).

Before any work everything is validated: models in eval mode, one probe batch with images in
``[0, 1]`` and ``(N, classes)`` finite logits (rows that look like probabilities, non-negative
and summing to 1, are rejected: cross-entropy on probabilities weakens gradient attacks), labels
in range, attack names, budgets, bands and options, the output folder. A crash mid-run keeps the
records computed so far (``results.json`` says ``"status": "crashed"`` and why).

Attacks need gradients, which ``torch.inference_mode`` (Lightning's default in
``validate`` / ``test`` / ``predict``) and ``torch.no_grad`` forbid: the evaluation runs under
``torch.inference_mode(False)`` and ``torch.enable_grad()``, on clones of the data, so it works
when called from inside a Lightning hook. Parameters are frozen (``requires_grad=False``) while
it runs and restored afterwards, so no ``.grad`` of the models is touched.

Determinism: data order, attack random starts and noise draw from seeds derived from ``seed``
(:func:`~lightning_bandlimit.recipes.attack_suite.derive_seed`) on a forked RNG (the caller's
RNG state is left alone), so the same seed gives identical records on CPU; on CUDA up to
non-deterministic kernels unless ``torch.use_deterministic_algorithms(True)``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import re
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader
from torchmetrics import MaxMetric, MeanMetric
from tqdm.auto import tqdm

from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recipes.attack_suite import (
    ATTACKS,
    THREAT_BAND,
    THREAT_FULL,
    THREAT_NOISE,
    AttackSpec,
    build_attack,
    derive_seed,
    spec_band,
    spec_band_name,
    spec_model_band,
    spec_norm,
    spec_options,
    validate_attack_specs,
)
from lightning_bandlimit.recipes.input_band import BandSubspace, InputBand, input_band
from lightning_bandlimit.recipes.report import (
    RobustnessRecord,
    WorstCaseRecord,
    atomic_write,
    library_versions,
    plot_accuracy_vs_eps,
    summary_markdown,
    write_results,
)
from lightning_bandlimit.recipes.sanity import (
    SanityCheck,
    SanityCheckError,
    check_budget,
    check_eps_zero,
    check_gradients,
    check_large_budget,
    check_monotonic,
)
from lightning_bandlimit.recipes.study import study_markdown
from lightning_bandlimit.surgery import bandlimit, bandlimited_layers

__all__ = [
    "RobustnessReport",
    "evaluate_robustness",
    "load_classifier",
    "main",
    "main_run_checkpoints",
    "resolve_device",
]

_BAND_CALLBACKS = ("BandLimit", "AdaptiveBandLimit")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` (CUDA when available, else CPU) or an explicit device.

    Args:
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ... or a ``torch.device``.

    Raises:
        ValueError: for an unparsable device, or CUDA when it is not available.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"expected device 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; expected 'auto' or 'cpu'")
    return resolved


def _training_modules(model: nn.Module) -> list[str]:
    return [name or "<root>" for name, module in model.named_modules() if module.training]


def load_classifier(source: str | Path | nn.Module, device: str | torch.device = "cpu") -> nn.Module:
    """A classifier to evaluate: a module as is, or an ``ImageClassifier`` checkpoint band-limited as trained.

    A checkpoint is loaded with ``ImageClassifier.load_from_checkpoint``; when its callback
    states hold a ``BandLimit`` / ``AdaptiveBandLimit`` entry with ``compression > 0`` (whose
    state records ``include``, ``exclude`` and ``pointwise``), the same convolutions are
    band-limited again at that compression, so the model is evaluated as it was trained. The
    result is in eval mode on ``device``.

    Args:
        source: an ``nn.Module`` (must be in eval mode already; it is moved to ``device``) or
            the path of a Lightning checkpoint of an ``ImageClassifier``.
        device: where to put the model.

    Raises:
        ValueError: for a module (or submodule) in training mode.
        FileNotFoundError: for a checkpoint path that is not a file.
        TypeError: for anything else.

    Example:
        >>> load_classifier(nn.Linear(2, 2))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: expected a model in eval mode (...), got Linear with 1 module(s) in training mode: <root>
    """
    if isinstance(source, nn.Module):
        training = _training_modules(source)
        if training:
            shown = ", ".join(training[:5]) + (", ..." if len(training) > 5 else "")
            raise ValueError(
                "expected a model in eval mode (call model.eval() first: attacks and BatchNorm statistics "
                f"need it), got {type(source).__name__} with {len(training)} module(s) in training mode: "
                f"{shown}"
            )
        return source.to(resolve_device(device))
    return _load_checkpoint(source, device)[0]


def _load_checkpoint(source: Any, device: str | torch.device) -> tuple[nn.Module, list[dict[str, Any]]]:
    """(model, its BandLimit states) from an ImageClassifier checkpoint."""
    if not isinstance(source, (str, Path)):
        raise TypeError(f"expected an nn.Module or a checkpoint path, got {type(source).__name__}")
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {str(path)!r}")
    resolved = resolve_device(device)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    callbacks = checkpoint.get("callbacks") or {}
    states = [dict(state) for key, state in callbacks.items() if str(key).startswith(_BAND_CALLBACKS)]
    model = ImageClassifier.load_from_checkpoint(path, map_location=resolved)
    for state in states:
        if float(state.get("compression", 0.0)) > 0:
            bandlimit(
                model,
                float(state["compression"]),
                include=state.get("include"),
                exclude=state.get("exclude"),
                pointwise=bool(state.get("pointwise", False)),
            )
    return model.eval(), states


def main_run_checkpoints(main_run: str | Path = "latest", runs_dir: str | Path = "runs") -> dict[str, Path]:
    """The band-limited and full-spectrum checkpoints of a main-job run (``summary.json``).

    Args:
        main_run: a ``runs/main-<timestamp>`` folder (or its ``summary.json``), or ``"latest"``
            for the newest ``main-*`` folder with a ``summary.json`` under ``runs_dir``.
        runs_dir: where ``"latest"`` looks.

    Returns:
        ``{"band-limited": path, "full-spectrum": path}`` (the variants the run recorded).

    Raises:
        FileNotFoundError: if no run, summary or checkpoint is found (the message says where
            it looked).
        ValueError: for a summary without checkpoints.

    Example:
        >>> main_run_checkpoints("latest", runs_dir="/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: no main-job run (main-*/summary.json) under '/nonexistent'; run ... --main_run PATH
    """
    if str(main_run) == "latest":
        runs = sorted(p.parent for p in Path(runs_dir).glob("main-*/summary.json"))
        if not runs:
            raise FileNotFoundError(
                f"no main-job run (main-*/summary.json) under {str(runs_dir)!r}; run "
                "`python -m lightning_bandlimit.main_job` first or pass --main_run PATH"
            )
        run = runs[-1]
    else:
        run = Path(main_run)
        run = run.parent if run.name == "summary.json" else run
    summary_path = run / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"main-job summary not found: {str(summary_path)!r}")
    summary = json.loads(summary_path.read_text())
    found: dict[str, Path] = {}
    for result in summary.get("results", []):
        variant, checkpoint = result.get("variant"), result.get("checkpoint")
        if not checkpoint:
            raise ValueError(f"{summary_path}: the {variant!r} run recorded no checkpoint")
        path = Path(checkpoint)
        if not path.is_absolute() and not path.exists():
            path = run / path
        if not path.is_file():
            raise FileNotFoundError(
                f"{summary_path}: checkpoint of the {variant!r} run not found: {str(path)!r}"
            )
        found[str(variant)] = path
    if not found:
        raise ValueError(
            f"{summary_path}: expected 'results' with 'variant' and 'checkpoint' entries, got none"
        )
    return found


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


@dataclass
class _Model:
    name: str
    module: nn.Module
    source: str
    num_classes: int = 0
    band_limit: list[dict[str, Any]] = field(default_factory=list)
    variant: str = ""
    replicate: int = 0
    band: InputBand | None = None
    band_error: str | None = None  # why no input band could be derived


Source = nn.Module | str | Path


def _replicates(models: Mapping[str, Source | Sequence[Source]]) -> list[tuple[str, str, int, Source]]:
    """``(model name, variant, replicate, source)``: a list of sources is a variant's replicates."""
    out = []
    for variant, sources in models.items():
        if isinstance(sources, (list, tuple)):
            if not sources:
                raise ValueError(
                    f"expected at least one checkpoint or module for variant {variant!r}, got none"
                )
            out += [(f"{variant}#{i}", variant, i, source) for i, source in enumerate(sources)]
        else:
            out.append((variant, variant, 0, sources))
    return out


def _derive_bands(evaluated: Sequence[_Model], probe: torch.Tensor) -> None:
    """Each model's input band (``None`` with the reason when it has none, e.g. no Conv2d)."""
    for model in evaluated:
        try:
            model.band = input_band(model.module, tuple(probe.shape[1:]), name=model.name, probe=probe[:2])
        except ValueError as error:
            model.band, model.band_error = None, str(error)


def _band_limited_variants(evaluated: Sequence[_Model]) -> list[str]:
    variants = []
    for model in evaluated:
        if model.band is not None and not model.band.dropped.is_empty and model.variant not in variants:
            variants.append(model.variant)
    return variants


def _resolve_subspaces(
    specs: Sequence[AttackSpec], evaluated: Sequence[_Model]
) -> tuple[dict[str, BandSubspace], dict[str, str]]:
    """attack key -> the subspace of its ``band: dropped | kept`` (the same for every model), and
    attack key -> the variant that defines it."""
    variants = list(dict.fromkeys(m.variant for m in evaluated))
    limited = _band_limited_variants(evaluated)
    out: dict[str, BandSubspace] = {}
    sources: dict[str, str] = {}
    for spec in specs:
        part = spec_model_band(spec)
        if part is None:
            continue
        source = spec.band_of
        if source is None:
            if len(limited) != 1:
                raise ValueError(
                    f"attack {spec.key!r}: band {part!r} needs its source model; expected band_of: one of "
                    f"{variants}, got no band_of and {len(limited)} band-limited variants {limited}"
                )
            source = limited[0]
        if source not in variants:
            raise ValueError(
                f"attack {spec.key!r}: expected band_of to name an evaluated model, one of {variants}, "
                f"got {source!r}"
            )
        members = [m for m in evaluated if m.variant == source]
        for m in members:
            if m.band is None:
                raise ValueError(
                    f"attack {spec.key!r}: the band of {m.name!r} cannot be derived: {m.band_error}"
                )
        band = members[0].band
        assert band is not None
        different = [m.name for m in members[1:] if not band.same_as(m.band)]  # type: ignore[arg-type]
        if different:
            raise ValueError(
                f"attack {spec.key!r}: expected the replicates of {source!r} to share one input band, got "
                f"{different} differing from {members[0].name!r}"
            )
        subspace = band.part(part)
        if subspace.is_empty:
            raise ValueError(
                f"attack {spec.key!r}: the {part} band of {source!r} is empty ({band.describe()} keeps every "
                "frequency); name a band-limited model with band_of"
            )
        out[spec.key], sources[spec.key] = subspace, source
    return out, sources


@dataclass
class _Run:
    """Per-sample results of one attack run on one model."""

    correct: torch.Tensor  # bool (n,)
    l2: torch.Tensor  # (n,)
    linf: torch.Tensor  # (n,)
    seconds: float


def _model_note(model: _Model) -> str:
    compression = max((float(s.get("compression", 0.0)) for s in model.band_limit), default=0.0)
    return model.source + (f", band-limited at compression {compression:g}" if compression > 0 else "")


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "model"


def _loader(data: Any) -> Iterable[Any]:
    if isinstance(data, pl.LightningDataModule):
        data.prepare_data()
        data.setup("test")
        loader = data.test_dataloader()
        if isinstance(loader, (list, tuple)):
            if len(loader) != 1:
                raise ValueError(
                    f"expected one test dataloader from {type(data).__name__}, got {len(loader)}"
                )
            loader = loader[0]
        return loader
    if isinstance(data, DataLoader):
        return data
    raise TypeError(f"expected a LightningDataModule or a DataLoader, got {type(data).__name__}")


def _read_data(data: Any, limit: int | None, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``limit`` samples as CPU batches, cloned out of inference mode and validated."""
    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    count = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # shuffling loaders draw their order from the global RNG
        for index, batch in enumerate(_loader(data)):
            if not isinstance(batch, (list, tuple)) or len(batch) < 2:
                raise ValueError(
                    f"expected batches of (images, labels), got {type(batch).__name__} in batch {index}"
                )
            images, labels = batch[0], batch[1]
            if not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.dim() != 4:
                got = (
                    f"{images.dtype} {tuple(images.shape)}"
                    if isinstance(images, torch.Tensor)
                    else type(images).__name__
                )
                raise ValueError(f"expected float images of shape (N, C, H, W), got {got} in batch {index}")
            if (
                not isinstance(labels, torch.Tensor)
                or labels.dim() != 1
                or len(labels) != len(images)
                or (labels.is_floating_point() or labels.is_complex())
            ):
                got = (
                    f"{labels.dtype} {tuple(labels.shape)}"
                    if isinstance(labels, torch.Tensor)
                    else type(labels).__name__
                )
                raise ValueError(
                    f"expected integer labels of shape ({len(images)},), got {got} in batch {index}"
                )
            if limit is not None:
                images, labels = images[: limit - count], labels[: limit - count]
            if len(images) == 0:
                continue
            low, high = images.min().item(), images.max().item()
            if not (0.0 <= low and high <= 1.0):  # also catches NaN
                raise ValueError(
                    f"expected images in [0, 1] (normalisation belongs inside the model), got values in "
                    f"[{low:.4g}, {high:.4g}] in batch {index}"
                )
            batches.append((images.detach().clone(), labels.detach().clone().long()))
            count += len(images)
            if limit is not None and count >= limit:
                break
    if not batches:
        raise ValueError("expected at least one sample from the data, got none")
    return batches


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


@contextlib.contextmanager
def _frozen(modules: Iterable[nn.Module]) -> Iterator[None]:
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


def _describe_data(data: Any, n: int, batches: int) -> dict[str, Any]:
    description: dict[str, Any] = {
        "class": f"{type(data).__module__}.{type(data).__qualname__}",
        "samples": n,
        "batches": batches,
    }
    hparams = getattr(data, "hparams", None)
    if hparams:
        description["hparams"] = dict(hparams)
    if isinstance(data, DataLoader):
        description["dataset"] = type(data.dataset).__name__
        description["batch_size"] = data.batch_size
    return description


def _mean(values: torch.Tensor) -> float:
    metric = MeanMetric(nan_strategy="disable").set_dtype(torch.float64)
    metric.update(values.double())
    return float(metric.compute())


def _max(values: torch.Tensor) -> float:
    metric = MaxMetric(nan_strategy="disable")
    metric.update(values.float())
    return float(metric.compute())


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
    """Evaluate classifiers side by side under attacks; write the report (see the module docstring).

    Args:
        models: name -> an ``nn.Module`` in eval mode (images in ``[0, 1]`` -> logits) or an
            ``ImageClassifier`` checkpoint path (see :func:`load_classifier`), or a list of them:
            the replicates of one variant (e.g. one checkpoint per training seed), evaluated each
            as ``name#i`` and reported as mean +- std with paired differences between variants.
        data: a LightningDataModule (its test set) or a DataLoader of ``(images, labels)``.
        attacks: the attacks (:class:`~lightning_bandlimit.recipes.attack_suite.AttackSpec` or
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
        ValueError: for invalid inputs (see the module docstring), before any work.
        FileNotFoundError: for a missing checkpoint.
        FileExistsError: if ``output_dir`` holds a ``results.json`` and ``overwrite`` is false.
        TypeError: for ``data`` of another type.
        SanityCheckError: if ``strict`` and a sanity check failed (outputs are written first).

    Example:
        >>> import tempfile
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
    started_at = datetime.datetime.now().isoformat(timespec="seconds")
    started = time.perf_counter()
    with torch.inference_mode(False), torch.enable_grad():
        # ---------------------------------------------------------------- validation, no work
        if not isinstance(models, Mapping) or not models:
            raise ValueError(
                f"expected a non-empty mapping of name -> model or checkpoint path, got {models!r}"
            )
        for name in models:
            if not isinstance(name, str) or not name:
                raise ValueError(f"expected non-empty model names, got {name!r}")
        specs = validate_attack_specs(
            list(attacks) if not isinstance(attacks, (Mapping, AttackSpec)) else attacks
        )
        for label, value, minimum in (
            ("limit", limit, 1),
            ("heat_map_limit", heat_map_limit, 1),
            ("sanity_samples", sanity_samples, 1),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < minimum
            ):
                raise ValueError(f"expected {label} to be None or an integer >= {minimum}, got {value!r}")
        if not (isinstance(heat_map_eps, (int, float)) and math.isfinite(heat_map_eps) and heat_map_eps > 0):
            raise ValueError(f"expected heat_map_eps > 0, got {heat_map_eps!r}")
        target = resolve_device(device)
        output_dir = Path(output_dir)
        if output_dir.exists() and not output_dir.is_dir():
            raise ValueError(f"expected output_dir to be a folder, got the file {str(output_dir)!r}")
        existing = output_dir / "results.json"
        if existing.is_file() and existing.stat().st_size > 0 and not overwrite:
            raise FileExistsError(
                f"{str(existing)!r} exists: pass overwrite=True (--overwrite true) or choose another "
                "output_dir"
            )
        evaluated: list[_Model] = []
        for name, variant, replicate, source in _replicates(models):
            if isinstance(source, nn.Module):
                module, states = load_classifier(source, target), []
            else:
                module, states = _load_checkpoint(source, target)
            if any(p.is_inference() for p in module.parameters()):
                raise ValueError(
                    f"model {name!r}: expected ordinary parameters, got parameters created under "
                    "torch.inference_mode (they cannot take part in autograd); build the model outside it"
                )
            evaluated.append(
                _Model(
                    name,
                    module,
                    str(source)
                    if not isinstance(source, nn.Module)
                    else f"nn.Module {type(source).__name__}",
                    band_limit=states,
                    variant=variant,
                    replicate=replicate,
                )
            )
        batches = _read_data(data, limit, seed)
        n = sum(len(b[1]) for b in batches)
        probe_x, probe_y = (t.to(target) for t in batches[0])
        all_labels = torch.cat([b[1] for b in batches])
        needs_gradients = any(ATTACKS[s.name].threat != THREAT_NOISE for s in specs)
        for model in evaluated:
            with torch.no_grad():
                output = model.module(probe_x)
            model.num_classes = _check_logits(model.name, output, len(probe_y), all_labels)
            if needs_gradients and not _differentiable(model.module, probe_x):
                raise ValueError(
                    f"model {model.name!r}: expected logits that depend differentiably on the input for "
                    "gradient-based attacks, got none (argmax, detach or no_grad inside the model?); wrap "
                    "non-differentiable parts in a straight-through estimator (BPDA) or run noise attacks "
                    "only"
                )
        _derive_bands(evaluated, probe_x)
        subspaces, sources = _resolve_subspaces(specs, evaluated)
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
        if heat_map:
            from lightning_bandlimit.recipes.fourier_heatmap import fourier_heat_map, save_heat_map

        # ---------------------------------------------------------------- work
        output_dir.mkdir(parents=True, exist_ok=True)
        batches = [(x.to(target), y.to(target)) for x, y in batches]
        records: list[RobustnessRecord] = []
        worst: list[WorstCaseRecord] = []
        checks: list[SanityCheck] = []
        heat_maps: list[dict[str, Any]] = []
        paths: dict[str, Path] = {}
        config = {
            "models": {
                m.name: {
                    "source": m.source,
                    "class": type(m.module).__name__,
                    "num_classes": m.num_classes,
                    "band_limit": m.band_limit,
                    "band_limited_layers": sum(1 for _ in bandlimited_layers(m.module)),
                    "variant": m.variant,
                    "replicate": m.replicate,
                    "input_band": None
                    if m.band is None
                    else {
                        "layer": m.band.layer,
                        "compression": m.band.compression,
                        "kept_dims": m.band.kept.dims,
                        "dropped_dims": m.band.dropped.dims,
                        "box_cycles_per_pixel": list(m.band.box),
                    },
                }
                for m in evaluated
            },
            "data": _describe_data(data, n, len(batches)),
            "attacks": [
                {
                    **asdict(s),
                    "key": s.key,
                    "norm": spec_norm(s),
                    "threat": ATTACKS[s.name].threat,
                    "band_resolved": spec_band(s),
                    "band_source": subspaces[s.key].band.describe() if s.key in subspaces else None,
                    "options_resolved": spec_options(s),
                }
                for s in specs
            ],
            "limit": limit,
            "device": str(target),
            "heat_map": heat_map,
            "heat_map_eps": heat_map_eps,
            "heat_map_limit": heat_map_limit,
            "strict": strict,
            "sanity_samples": sanity_samples,
        }
        state: dict[str, Any] = {
            "status": "running",
            "error": None,
            "started": started_at,
            "wall_s": 0.0,
            "seed": seed,
            "n_samples": n,
            "versions": library_versions(),
            "config": config,
        }

        def save() -> None:
            state["wall_s"] = time.perf_counter() - started
            extra = {**state, "worst_case": worst, "sanity_checks": checks, "heat_maps": heat_maps}
            paths["results_json"], paths["results_csv"] = write_results(output_dir, records, extra)

        runs_per_model = sum(1 if ATTACKS[s.name].minimum_norm else len(s.eps) for s in specs)
        bar = tqdm(
            total=len(evaluated) * runs_per_model * len(batches),
            desc="robustness",
            unit="batch",
            disable=not progress,
            dynamic_ncols=True,
        )
        try:
            save()
            with _frozen(m.module for m in evaluated):
                for model in evaluated:
                    _evaluate_model(
                        model,
                        specs,
                        batches,
                        seed,
                        target,
                        records,
                        worst,
                        checks,
                        save,
                        bar,
                        sanity_samples,
                        subspaces,
                        sources,
                    )
                bar.close()
                for model in evaluated:
                    checks.append(check_eps_zero(records, model=model.name))
                    checks.append(check_monotonic(records, model=model.name))
                    checks.append(check_budget(records, model=model.name))
                names = [m.name for m in evaluated]
                checks.sort(
                    key=lambda c: names.index(c.model) if c.model in names else -1
                )  # stable: per model
                save()
                if heat_map:
                    images = torch.cat([b[0] for b in batches])[:heat_map_limit]
                    labels = all_labels.to(target)[:heat_map_limit]
                    grids: dict[str, torch.Tensor] = {}
                    for model in evaluated:
                        begun = time.perf_counter()
                        grid = fourier_heat_map(
                            model.module, images, labels, eps=heat_map_eps, seed=seed, progress=progress
                        )
                        stem = output_dir / f"heat_map_{_safe_name(model.name)}"
                        png, npy = stem.with_suffix(".png"), stem.with_suffix(".npy")
                        save_heat_map(grid, png, npy, title=f"{model.name} (L2 {heat_map_eps:g})")
                        grids[model.name] = grid.cpu()
                        paths[f"heat_map_png:{model.name}"], paths[f"heat_map_npy:{model.name}"] = png, npy
                        heat_maps.append(
                            {
                                "model": model.name,
                                "png": png.name,
                                "npy": npy.name,
                                "eps": heat_map_eps,
                                "n": len(labels),
                                "mean_error": float(grid.float().mean()),
                                "seconds": time.perf_counter() - begun,
                            }
                        )
                        save()
            notes = [
                (
                    f"{len(evaluated)} model(s), {n} test samples each, seed {seed}, device {target}, "
                    f"{datetime.datetime.now().isoformat(timespec='seconds')}"
                ),
                "Models: " + "; ".join(f"{m.name} ({_model_note(m)})" for m in evaluated),
            ]
            limited_variants = _band_limited_variants(evaluated)
            other_variants = [
                v for v in dict.fromkeys(m.variant for m in evaluated) if v not in limited_variants
            ]
            pair = (
                (limited_variants[0], other_variants[0])
                if len(limited_variants) == 1 and len(other_variants) == 1
                else (None, None)
            )
            if heat_map and pair[0] is not None and pair[1] is not None:
                paths["heat_map_difference"] = _heat_map_difference(
                    evaluated, grids, output_dir, pair[0], pair[1], eps=heat_map_eps
                )
            summary = (
                summary_markdown(records, worst, checks, notes=notes)
                + "\n"
                + study_markdown(records, worst, *pair)
            )
            paths["plot"] = plot_accuracy_vs_eps(
                records,
                output_dir / "accuracy_vs_eps.png",
                title=f"accuracy vs eps ({n} samples, seed {seed})",
            )
            paths["summary"] = atomic_write(output_dir / "summary.md", summary)
        except BaseException as error:
            bar.close()
            state["status"] = "crashed" if isinstance(error, Exception) else "interrupted"
            state["error"] = f"{type(error).__name__}: {error}"
            with contextlib.suppress(Exception):
                save()
            raise
        state["status"] = "complete"
        save()
    report = RobustnessReport(output_dir, records, worst, checks, paths, summary)
    if strict and not report.passed:
        raise SanityCheckError(report.failed_checks, str(output_dir))
    return report


def _heat_map_difference(
    evaluated: Sequence[_Model],
    grids: Mapping[str, torch.Tensor],
    output_dir: Path,
    limited: str,
    full: str,
    *,
    eps: float,
) -> Path:
    """Mean heat map per variant, and the band-limited minus full-spectrum difference with the kept box."""
    from lightning_bandlimit.recipes.fourier_heatmap import save_heat_map_difference

    means = {
        variant: torch.stack([grids[m.name] for m in evaluated if m.variant == variant]).mean(0)
        for variant in (limited, full)
    }
    band = next(m.band for m in evaluated if m.variant == limited)
    assert band is not None
    path = output_dir / "heat_map_difference.png"
    save_heat_map_difference(
        means[limited],
        means[full],
        path,
        names=(limited, full),
        box=band.box,
        title=(
            f"Fourier heat maps, L2 {eps:g} (mean over replicates); box: what {limited}'s input layer "
            f"{band.layer!r} keeps at compression {band.compression:.3g}"
        ),
    )
    return path


def _attack_batches(
    attack: Any, model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], key: str, bar: Any
) -> _Run:
    began = time.perf_counter()
    correct, l2, linf = [], [], []
    for x, y in batches:
        adv = attack(x, y)
        if not isinstance(adv, torch.Tensor) or adv.shape != x.shape:
            got = tuple(adv.shape) if isinstance(adv, torch.Tensor) else type(adv).__name__
            raise RuntimeError(f"attack {key!r} returned {got}, expected images of shape {tuple(x.shape)}")
        adv = adv.detach().to(x.device)
        with torch.no_grad():
            correct.append((model(adv).argmax(1) == y).cpu())
            delta = (adv - x).flatten(1)
            l2.append(delta.norm(dim=1).cpu())
            linf.append(delta.abs().amax(dim=1).cpu())
        bar.update(1)
    return _Run(torch.cat(correct), torch.cat(l2), torch.cat(linf), time.perf_counter() - began)


def _evaluate_model(
    model: _Model,
    specs: Sequence[AttackSpec],
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    seed: int,
    device: torch.device,
    records: list[RobustnessRecord],
    worst: list[WorstCaseRecord],
    checks: list[SanityCheck],
    save: Any,
    bar: Any,
    sanity_samples: int,
    subspaces: Mapping[str, BandSubspace],
    sources: Mapping[str, str],
) -> None:
    module = model.module
    with torch.no_grad():
        clean = torch.cat([(module(x).argmax(1) == y).cpu() for x, y in batches])
    clean_accuracy = _mean(clean.float())
    n = len(clean)
    probe_x = torch.cat([b[0] for b in batches])[:sanity_samples]
    probe_y = torch.cat([b[1] for b in batches])[:sanity_samples]
    checks.append(check_gradients(module, probe_x, probe_y, name=model.name))
    checks.append(
        check_large_budget(
            module,
            probe_x,
            probe_y,
            num_classes=model.num_classes,
            seed=derive_seed(seed, "large_budget"),
            name=model.name,
        )
    )
    save()
    masks: list[tuple[AttackSpec, str | None, float, torch.Tensor]] = []

    def add(
        spec: AttackSpec,
        eps: float,
        correct: torch.Tensor,
        l2: torch.Tensor,
        linf: torch.Tensor,
        seconds: float,
        run_seed: int,
    ) -> None:
        info = ATTACKS[spec.name]
        norm, band = spec_norm(spec), spec_band(spec)
        records.append(
            RobustnessRecord(
                model=model.name,
                attack=spec.key,
                attack_name=spec.name,
                threat=info.threat,
                norm=norm,
                eps=eps,
                band=list(band) if band else None,
                band_name=spec_band_name(spec) or spec_model_band(spec),
                iterative=info.iterative,
                n=n,
                clean_correct=int(clean.sum()),
                robust_correct=int(correct.sum()),
                flipped=int((correct != clean).sum()),
                clean_accuracy=clean_accuracy,
                robust_accuracy=_mean(correct.float()),
                mean_l2=_mean(l2),
                mean_linf=_mean(linf),
                max_l2=_max(l2),
                max_linf=_max(linf),
                seconds=seconds,
                seed=run_seed,
                variant=model.variant,
                replicate=model.replicate,
                band_source=sources.get(spec.key),
            )
        )
        masks.append((spec, norm, eps, correct))
        save()

    for spec in specs:
        info = ATTACKS[spec.name]
        if info.minimum_norm:
            run_seed = derive_seed(seed, spec.key)
            bar.set_postfix_str(f"{model.name} {spec.key}", refresh=False)
            with _seeded(device, run_seed):
                attack = build_attack(
                    spec,
                    module,
                    max(spec.eps),
                    num_classes=model.num_classes,
                    seed=run_seed,
                    subspace=subspaces.get(spec.key),
                )
                run = _attack_batches(attack, module, batches, spec.key, bar)
            for eps in spec.eps:
                inside = run.l2 <= eps
                correct = clean & (run.correct | ~inside)
                add(
                    spec,
                    eps,
                    correct,
                    torch.where(inside, run.l2, 0.0),
                    torch.where(inside, run.linf, 0.0),
                    run.seconds,
                    run_seed,
                )
            continue
        for eps in spec.eps:
            run_seed = derive_seed(seed, spec.key, eps)
            bar.set_postfix_str(f"{model.name} {spec.key} eps={eps:.4g}", refresh=False)
            with _seeded(device, run_seed):
                attack = build_attack(
                    spec,
                    module,
                    eps,
                    num_classes=model.num_classes,
                    seed=run_seed,
                    subspace=subspaces.get(spec.key),
                )
                run = _attack_batches(attack, module, batches, spec.key, bar)
            add(spec, eps, run.correct, run.l2, run.linf, run.seconds, run_seed)

    worst.extend(_worst_case(model, clean, clean_accuracy, masks, sources))
    save()


def _worst_case(
    model: _Model,
    clean: torch.Tensor,
    clean_accuracy: float,
    masks: Sequence[tuple[AttackSpec, str | None, float, torch.Tensor]],
    sources: Mapping[str, str],
) -> list[WorstCaseRecord]:
    groups: dict[tuple, list[tuple[AttackSpec, float, torch.Tensor]]] = {}
    for spec, norm, eps, correct in masks:
        threat = ATTACKS[spec.name].threat
        if threat not in (THREAT_FULL, THREAT_BAND) or norm is None:
            continue
        part = spec_model_band(spec)
        band = (part, sources[spec.key]) if part else spec_band(spec)
        groups.setdefault((threat != THREAT_FULL, norm, round(eps, 12), band), []).append(
            (spec, eps, correct)
        )
    out = []
    for (banded, norm, _, band), members in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], tuple(map(str, kv[0][3] or ())))
    ):
        robust = clean.clone()
        for _, _, correct in members:
            robust &= correct
        model_band = band is not None and isinstance(band[0], str)
        out.append(
            WorstCaseRecord(
                model=model.name,
                threat=THREAT_BAND if banded else THREAT_FULL,
                norm=norm,
                eps=members[0][1],
                band=list(band) if band and not model_band else None,
                attacks=[s.key for s, _, _ in members],
                n=len(clean),
                clean_accuracy=clean_accuracy,
                robust_correct=int(robust.sum()),
                robust_accuracy=_mean(robust.float()),
                variant=model.variant,
                replicate=model.replicate,
                band_name=band[0] if model_band else None,
                band_source=band[1] if model_band else None,
            )
        )
    return out


# -------------------------------------------------------------------------------------------- CLI


def _robustness_cli(
    models: dict[str, str | list[str]] | None = None,
    main_run: str | None = None,
    runs_dir: str = "runs",
    data: pl.LightningDataModule | None = None,
    attacks: list[AttackSpec] | None = None,
    output_dir: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    device: str = "auto",
    heat_map: bool = True,
    heat_map_eps: float = 4.0,
    heat_map_limit: int | None = 256,
    sanity_samples: int = 32,
    strict: bool = True,
    overwrite: bool = False,
    progress: bool = True,
) -> None:
    """Evaluate classifiers under a suite of attacks and write a side-by-side report.

    Args:
        models: name -> ImageClassifier checkpoint path, e.g. ``'{mine: runs/x/last.ckpt}'``, or a
            list of paths: that variant's replicates (one per training seed), reported as mean +- std
            with paired differences, e.g. ``'{bl: [a.ckpt, b.ckpt], fs: [c.ckpt, d.ckpt]}'``.
        main_run: a main-job run folder, or ``latest`` (the newest runs_dir/main-*): adds its
            band-limited and full-spectrum checkpoints.
        runs_dir: where ``--main_run latest`` looks, and the parent of the default output folder.
        data: the LightningDataModule whose test set is used (class_path; our short names work).
        attacks: list of attacks: name, eps (list; fractions such as "8/255" allowed), band,
            options, label.
        output_dir: the output folder (default runs_dir/robustness-<timestamp>).
        limit: evaluate the first LIMIT test samples only.
        seed: the evaluation seed.
        device: auto, cpu, cuda, cuda:N.
        heat_map: compute Fourier heat maps.
        heat_map_eps: L2 norm of the heat map's Fourier-basis perturbations.
        heat_map_limit: samples used for the heat maps.
        sanity_samples: samples of the gradient and large-budget sanity checks.
        strict: exit with an error (after writing all outputs) when a sanity check fails.
        overwrite: replace an existing results.json in output_dir.
        progress: show a progress bar.
    """


def main(args: list[str] | None = None) -> Path:
    """Entry point of ``lightning-bandlimit robustness``: parse, evaluate, print the summary.

    ``--config`` takes a YAML file or a packaged recipe's name (``robustness``); every other
    option of :func:`evaluate_robustness` is a flag, plus ``--models`` (name -> checkpoint),
    ``--main_run PATH|latest`` and ``--runs_dir``. Prints the Markdown summary to stdout.

    Args:
        args: the arguments after the subcommand (default ``sys.argv[1:]``).

    Returns:
        The output folder.

    Raises:
        SanityCheckError: when ``--strict`` (the default) and a sanity check failed, after all
            outputs are written and the summary printed.
        ValueError: for invalid inputs (no models, no data, no attacks, ...).

    Example:
        >>> main(["--config", "robustness", "--limit", "64"])  # doctest: +SKIP
        PosixPath('runs/robustness-20250101-120000')
    """
    from jsonargparse import ActionConfigFile, ArgumentParser

    import lightning_bandlimit.data  # noqa: F401  (so that short class names resolve)

    parser = ArgumentParser(
        prog="lightning-bandlimit robustness",
        description="Evaluate classifiers under a suite of attacks and write a side-by-side report.",
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file or a packaged recipe name")
    parser.add_function_arguments(_robustness_cli, as_group=False)
    argv = sys.argv[1:] if args is None else list(args)
    from lightning_bandlimit.recipe_files import resolve_config_args

    config = parser.parse_args(resolve_config_args(argv))
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    init = instantiate(config)
    sources: dict[str, Any] = dict(init.models or {})
    if init.main_run:
        for name, path in main_run_checkpoints(init.main_run, init.runs_dir).items():
            if name in sources:
                raise ValueError(f"model name {name!r} is given by --models and by --main_run; rename one")
            sources[name] = path
    if not sources:
        raise ValueError(
            "expected models to evaluate: pass --models '{name: checkpoint}' and/or --main_run PATH|latest"
        )
    if init.data is None:
        raise ValueError("expected a datamodule: pass --data CLASS (e.g. SyntheticImageDataModule)")
    if not init.attacks:
        raise ValueError("expected attacks: pass --attacks '[{name: pgd, eps: [0, 8/255]}]' or a --config")
    output_dir = (
        Path(init.output_dir)
        if init.output_dir
        else (Path(init.runs_dir) / f"robustness-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    )
    report = evaluate_robustness(
        sources,
        init.data,
        init.attacks,
        output_dir,
        limit=init.limit,
        seed=init.seed,
        device=init.device,
        heat_map=init.heat_map,
        heat_map_eps=init.heat_map_eps,
        heat_map_limit=init.heat_map_limit,
        strict=False,
        progress=init.progress,
        overwrite=init.overwrite,
        sanity_samples=init.sanity_samples,
    )
    print(report.summary)
    if init.strict and not report.passed:
        raise SanityCheckError(report.failed_checks, str(output_dir))
    return output_dir


if __name__ == "__main__":
    main()
