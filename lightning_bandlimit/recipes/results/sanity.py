"""Sanity checks of a robustness evaluation (Carlini et al., "On Evaluating Adversarial Robustness").

Each check returns a :class:`SanityCheck`; the recipe reports all of them and, when ``strict``,
raises :class:`SanityCheckError` after writing its outputs if any failed.

* :func:`check_eps_zero`: a budget of 0 reproduces clean accuracy *exactly*, per sample (the
  prediction on every attacked image is right exactly when it is right on the clean image).
  Trips on randomised models and on attacks that perturb at ``eps = 0``.
* :func:`check_monotonic`: accuracy under an iterative attack is non-increasing in ``eps``.
  Tolerance: random starts make two runs at nearby budgets differ by chance, so an accuracy may
  exceed the lowest accuracy seen at any smaller budget by **at most one sample** (``1 / n``);
  more than that fails.
* :func:`check_gradients`: the input gradient of the logit margin (true-class logit minus the
  best other logit, which does not saturate like softmax cross-entropy) is finite everywhere
  and non-zero for every probed sample. Trips on masked gradients (rounding, argmax,
  ``detach``, ``no_grad`` inside the model) and NaN/inf gradients.
* :func:`check_large_budget`: PGD with an L-inf budget of 1 (the whole image box: any image is
  reachable) starting *from the clean images* (no random start, so a zero gradient cannot hide
  behind random noise) must bring accuracy down to at most chance, ``1 / classes``.
* :func:`check_budget`: every recorded perturbation is finite and within its declared budget
  (L-inf or L2, with a float32 rounding slack of ``1e-6 + 1e-5 * eps``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torchattacks
from torch import nn

if TYPE_CHECKING:
    from lightning_bandlimit.recipes.results.records import RobustnessRecord

__all__ = [
    "SanityCheck",
    "SanityCheckError",
    "check_budget",
    "check_eps_zero",
    "check_gradients",
    "check_large_budget",
    "check_monotonic",
    "raise_on_failure",
]


@dataclass(frozen=True)
class SanityCheck:
    """The outcome of one sanity check.

    Args:
        name: the check (``"eps_zero"``, ``"monotonic"``, ``"gradients"``, ``"large_budget"``,
            ``"budget"``).
        passed: whether it passed (a skipped check counts as passed).
        detail: what was measured, in words.
        model: the model it concerns (``None`` for checks over all records).
        skipped: nothing to check (e.g. no record at ``eps = 0``).
    """

    name: str
    passed: bool
    detail: str
    model: str | None = None
    skipped: bool = False

    def __str__(self) -> str:
        state = "SKIP" if self.skipped else "PASS" if self.passed else "FAIL"
        where = f" [{self.model}]" if self.model is not None else ""
        return f"{state} {self.name}{where}: {self.detail}"


class SanityCheckError(RuntimeError):
    """Raised when a sanity check of a robustness evaluation failed (``strict`` mode).

    Args:
        checks: the failed checks.
        where: where the full outputs are (added to the message).
    """

    def __init__(self, checks: Sequence[SanityCheck], where: str = "") -> None:
        self.checks = list(checks)
        lines = "\n".join(f"  {c}" for c in self.checks)
        suffix = f"\nall outputs were written to {where}" if where else ""
        super().__init__(f"{len(self.checks)} sanity check(s) failed:\n{lines}{suffix}")


def raise_on_failure(checks: Iterable[SanityCheck], where: str = "") -> None:
    """Raise :class:`SanityCheckError` listing the failed checks, if any.

    Args:
        checks: checks to inspect.
        where: where the outputs are, for the message.

    Raises:
        SanityCheckError: if a check failed.

    Example:
        >>> raise_on_failure([SanityCheck("gradients", True, "ok")])
        >>> raise_on_failure([SanityCheck("gradients", False, "all zero", model="m")])
        Traceback (most recent call last):
        ...
        lightning_bandlimit.recipes.results.sanity.SanityCheckError: 1 sanity check(s) failed:
          FAIL gradients [m]: all zero
    """
    failed = [c for c in checks if not c.passed]
    if failed:
        raise SanityCheckError(failed, where)


def _records_of(records: Iterable[RobustnessRecord], model: str | None) -> list[RobustnessRecord]:
    return [r for r in records if model is None or r.model == model]


def check_eps_zero(records: Iterable[RobustnessRecord], *, model: str | None = None) -> SanityCheck:
    """At ``eps = 0`` every attack must reproduce clean accuracy exactly, sample by sample.

    Args:
        records: evaluation records (``eps``, ``clean_correct``, ``robust_correct``,
            ``flipped``: samples whose correctness differs from the clean pass).
        model: only this model's records (all when ``None``).

    Example:
        >>> from lightning_bandlimit.recipes.results.records import RobustnessRecord
        >>> ok = RobustnessRecord.fabricate("m", "pgd", 0.0, n=10, clean_correct=8, robust_correct=8)
        >>> check_eps_zero([ok]).passed
        True
        >>> bad = RobustnessRecord.fabricate("m", "pgd", 0.0, clean_correct=8, robust_correct=7, flipped=1)
        >>> print(check_eps_zero([ok, bad]))  # doctest: +NORMALIZE_WHITESPACE
        FAIL eps_zero: 1 of 2 eps = 0 runs differ from the clean pass:
        m/pgd: 7/10 correct vs clean 8/10, 1 sample(s) changed
    """
    zero = [r for r in _records_of(records, model) if r.eps == 0]
    if not zero:
        return SanityCheck(
            "eps_zero",
            True,
            "skipped: no run at eps = 0 (add 0 to an attack's eps list)",
            model,
            skipped=True,
        )
    bad = [r for r in zero if r.robust_correct != r.clean_correct or r.flipped != 0]
    if not bad:
        return SanityCheck(
            "eps_zero",
            True,
            f"{len(zero)} eps = 0 run(s) reproduce the clean predictions' correctness exactly",
            model,
        )
    detail = "; ".join(
        f"{r.model}/{r.attack}: {r.robust_correct}/{r.n} correct vs clean {r.clean_correct}/{r.n}, "
        f"{r.flipped} sample(s) changed"
        for r in bad
    )
    return SanityCheck(
        "eps_zero",
        False,
        f"{len(bad)} of {len(zero)} eps = 0 runs differ from the clean pass: {detail}",
        model,
    )


def check_monotonic(
    records: Iterable[RobustnessRecord], *, model: str | None = None, tolerance: int = 1
) -> SanityCheck:
    """Accuracy under each iterative attack must not rise with ``eps`` (by more than ``tolerance`` samples).

    Records are grouped by model, attack and band; within a group, sorted by ``eps``, the
    number of correct samples at each budget may exceed the minimum over all smaller budgets by
    at most ``tolerance`` (default one sample, for random starts).

    Args:
        records: evaluation records (``iterative``, ``eps``, ``robust_correct``).
        model: only this model's records (all when ``None``).
        tolerance: allowed excess, in samples.

    Raises:
        ValueError: for a negative tolerance.

    Example:
        >>> from lightning_bandlimit.recipes.results.records import RobustnessRecord
        >>> curve = [RobustnessRecord.fabricate("m", "pgd", e, n=10, robust_correct=c)
        ...          for e, c in [(0.0, 9), (0.1, 5), (0.2, 6), (0.3, 2)]]
        >>> check_monotonic(curve).passed  # 6 after 5: within one sample
        True
        >>> curve.append(RobustnessRecord.fabricate("m", "pgd", 0.4, n=10, robust_correct=8))
        >>> print(check_monotonic(curve))
        FAIL monotonic: m/pgd: 8/10 correct at eps 0.4 > 2/10 at a smaller eps (tolerance 1 sample)
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be a non-negative number of samples, got {tolerance}")
    groups: dict[tuple, list[RobustnessRecord]] = defaultdict(list)
    for r in _records_of(records, model):
        if r.iterative:
            groups[(r.model, r.attack, tuple(r.band) if r.band else None)].append(r)
    if not groups:
        return SanityCheck("monotonic", True, "skipped: no iterative attack", model, skipped=True)
    violations = []
    points = 0
    for group in groups.values():
        lowest = math.inf
        for r in sorted(group, key=lambda r: r.eps):
            points += 1
            if r.robust_correct > lowest + tolerance:
                violations.append(
                    f"{r.model}/{r.attack}: {r.robust_correct}/{r.n} correct at eps {r.eps:.4g} > "
                    f"{int(lowest)}/{r.n} at a smaller eps"
                )
            lowest = min(lowest, r.robust_correct)
    unit = "sample" if tolerance == 1 else "samples"
    if violations:
        return SanityCheck(
            "monotonic", False, "; ".join(violations) + f" (tolerance {tolerance} {unit})", model
        )
    return SanityCheck(
        "monotonic",
        True,
        f"{len(groups)} iterative curve(s), {points} point(s): accuracy non-increasing in eps "
        f"(tolerance {tolerance} {unit})",
        model,
    )


def check_budget(records: Iterable[RobustnessRecord], *, model: str | None = None) -> SanityCheck:
    """Every recorded perturbation is finite and inside its declared budget.

    L-inf records need ``max_linf <= eps``, L2 records ``max_l2 <= eps``, each up to
    ``1e-6 + 1e-5 * eps`` for float32 rounding; random-noise records without a norm only need
    finite norms.

    Args:
        records: evaluation records (``norm``, ``eps``, ``max_l2``, ``max_linf``).
        model: only this model's records (all when ``None``).

    Example:
        >>> from lightning_bandlimit.recipes.results.records import RobustnessRecord
        >>> r = RobustnessRecord.fabricate("m", "pgd", 0.1, n=4, max_linf=0.25)
        >>> print(check_budget([r]))
        FAIL budget: m/pgd at eps 0.1: max L-inf 0.25 exceeds the budget
    """
    selected = _records_of(records, model)
    bad = []
    for r in selected:
        if not (math.isfinite(r.max_l2) and math.isfinite(r.max_linf)):
            bad.append(f"{r.model}/{r.attack} at eps {r.eps:.4g}: non-finite perturbation")
            continue
        slack = 1e-6 + 1e-5 * r.eps
        if r.norm == "Linf" and r.max_linf > r.eps + slack:
            bad.append(
                f"{r.model}/{r.attack} at eps {r.eps:.4g}: max L-inf {r.max_linf:.4g} exceeds the budget"
            )
        elif r.norm == "L2" and r.max_l2 > r.eps + slack:
            bad.append(f"{r.model}/{r.attack} at eps {r.eps:.4g}: max L2 {r.max_l2:.4g} exceeds the budget")
    if bad:
        return SanityCheck("budget", False, "; ".join(bad), model)
    if not selected:
        return SanityCheck("budget", True, "skipped: no records", model, skipped=True)
    return SanityCheck(
        "budget", True, f"{len(selected)} run(s): perturbations finite and within budget", model
    )


def _margin(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    true = logits.gather(1, labels[:, None]).squeeze(1)
    others = logits.scatter(1, labels[:, None], -math.inf)
    return true - others.amax(1)


def check_gradients(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *, name: str | None = None
) -> SanityCheck:
    """Input gradients of the logit margin must be finite everywhere and non-zero for every sample.

    Runs with gradients enabled even inside ``torch.inference_mode()`` / ``torch.no_grad()``.

    Args:
        model: the model, in eval mode, mapping ``[0, 1]`` images to logits.
        images: a probe batch.
        labels: its labels.
        name: the model's name in the report.

    Example:
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).eval()
        >>> x, y = torch.rand(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])
        >>> check_gradients(model, x, y).passed
        True
        >>> rounding = nn.Sequential(_Round(), model).eval()  # masks the gradient
        >>> print(check_gradients(rounding, x, y))
        FAIL gradients: 4 probe samples: gradient finite everywhere, zero for 4/4 samples (masked gradients?)
    """
    with torch.inference_mode(False), torch.enable_grad():
        x = images.detach().clone().requires_grad_(True)
        y = labels.detach().clone()
        n = len(x)
        try:
            logits = model(x)
        except (RuntimeError, ValueError) as error:  # the model itself failed: that is the finding
            return SanityCheck("gradients", False, f"forward failed: {error!r}", name)
        if not isinstance(logits, torch.Tensor) or not logits.requires_grad:
            return SanityCheck(
                "gradients",
                False,
                "the logits do not depend differentiably on the input (argmax, detach or no_grad inside "
                "the model?)",
                name,
            )
        (grad,) = torch.autograd.grad(_margin(logits, y).sum(), x, allow_unused=True)
    if grad is None:
        return SanityCheck(
            "gradients", False, "the margin does not depend on the input (gradient is None)", name
        )
    finite = bool(grad.isfinite().all())
    size = grad.detach().flatten(1).abs().amax(1)
    zero = int((size == 0).sum())
    passed = finite and zero == 0
    state = "finite everywhere" if finite else "NOT finite"
    detail = f"{n} probe samples: gradient {state}, zero for {zero}/{n} samples"
    if finite and zero < n:
        detail += f", median |grad|_inf {size[size > 0].median().item():.3g}"
    if zero:
        detail += " (masked gradients?)"
    return SanityCheck("gradients", passed, detail, name)


class _Round(nn.Module):
    """Quantise to 8 bits: a front end whose gradient is zero almost everywhere (doctest aid)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x * 255) / 255


def check_large_budget(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_classes: int,
    eps: float = 1.0,
    steps: int = 10,
    seed: int = 0,
    name: str | None = None,
) -> SanityCheck:
    """An (effectively) unbounded PGD must drive accuracy down to chance or below.

    PGD-Linf with budget ``eps`` (1 = the whole ``[0, 1]`` box), ``steps`` steps of
    ``2.5 * eps / steps``, no random start (from the clean images, so masked gradients cannot
    hide behind a random start). Passes when accuracy is at most ``1 / num_classes``.

    Args:
        model: the model, in eval mode.
        images: a probe batch in ``[0, 1]``.
        labels: its labels.
        num_classes: the number of classes (chance is ``1 / num_classes``).
        eps: the L-inf budget.
        steps: PGD steps.
        seed: RNG seed (the attack is deterministic; set for completeness).
        name: the model's name in the report.

    Raises:
        ValueError: for ``num_classes < 2``, ``eps <= 0`` or ``steps < 1``.

    Example:
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).eval()
        >>> x = torch.rand(8, 3, 2, 2)
        >>> check_large_budget(model, x, model(x).argmax(1), num_classes=3).passed
        True
    """
    if num_classes < 2 or not eps > 0 or steps < 1:
        raise ValueError(
            f"expected num_classes >= 2, eps > 0 and steps >= 1, got {num_classes}, {eps} and {steps}"
        )
    device = images.device
    with (
        torch.inference_mode(False),
        torch.enable_grad(),
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
    ):
        torch.manual_seed(seed)
        x, y = images.detach().clone(), labels.detach().clone()
        attack = torchattacks.PGD(model, eps=eps, alpha=2.5 * eps / steps, steps=steps, random_start=False)
        try:
            adv = attack(x, y)
        except RuntimeError as error:  # e.g. logits without a gradient path to the input
            return SanityCheck("large_budget", False, f"attack failed: {error}", name)
        with torch.no_grad():
            clean = (model(x).argmax(1) == y).float().mean().item()
            accuracy = (model(adv).argmax(1) == y).float().mean().item()
    chance = 1.0 / num_classes
    passed = accuracy <= chance
    detail = (
        f"PGD-Linf eps {eps:g}, {steps} steps from the clean images on {len(x)} samples: accuracy "
        f"{accuracy:.3f} (clean {clean:.3f}); must be <= chance {chance:.3f}"
    )
    if not passed:
        detail += " (gradient masking or a broken attack?)"
    return SanityCheck("large_budget", passed, detail, name)
