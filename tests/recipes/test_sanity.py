"""Each sanity check passes on a real model and trips on a model (or attack) built to violate it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torchattacks
from tiny_task import CLASSES, make_data, trained_linear_classifier
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchattacks.attack import Attack

from lightning_bandlimit.recipes.evaluation.evaluate import evaluate_robustness
from lightning_bandlimit.recipes.results.records import RobustnessRecord
from lightning_bandlimit.recipes.results.sanity import (
    SanityCheck,
    SanityCheckError,
    check_budget,
    check_eps_zero,
    check_gradients,
    check_large_budget,
    check_monotonic,
)
from lightning_bandlimit.recipes.threats import THREAT_FULL, AttackInfo, AttackSpec, registered_attack


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return trained_linear_classifier()


def loader(n: int = 32, seed: int = 1) -> DataLoader:
    return DataLoader(TensorDataset(*make_data(n, seed)), batch_size=16)


class Round(nn.Module):
    """8-bit quantisation: keeps the information, masks the gradient (zero almost everywhere)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x * 255) / 255


class ArgmaxLogits(nn.Module):
    """One-hot of the base model's argmax: right answers, no gradient at all."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(self.base(x).argmax(1), CLASSES).float() * 10


class NaNGradient(nn.Module):
    """Finite outputs whose input gradient is NaN (d sqrt(u)/du at u = 0 times du/dx = 0)."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + torch.sqrt(x - x).flatten(1).sum(1, keepdim=True)


class Randomised(nn.Module):
    """The base model plus fresh logit noise on every call."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + 20 * torch.randn(len(x), CLASSES)


class NoiseLover(nn.Module):
    """Two classes; right (class 0) only on noisy inputs: accuracy grows with a random start's eps."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(10.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noisy = (x.flatten(1).var(dim=1) > 1e-4).float()
        return torch.stack([noisy, 1 - noisy], dim=1) * self.scale + 0 * x.flatten(1).sum(1, keepdim=True)


class BrokenAttack(Attack):
    """A PGD that forgot its budget and always uses 0.3 (a bug an eps = 0 run must reveal)."""

    def __init__(self, model: nn.Module, eps: float) -> None:
        super().__init__("Broken", model)
        self.eps = eps
        self.inner = torchattacks.PGD(model, eps=0.3, alpha=0.05, steps=10)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(images, labels)


def _evaluate(
    tmp_path: Path, model: nn.Module, attacks: list[AttackSpec], data: Any = None, **kwargs: Any
) -> list[SanityCheck]:
    report = evaluate_robustness(
        {"m": model},
        data or loader(),
        attacks,
        tmp_path / "out",
        heat_map=False,
        progress=False,
        strict=False,
        **kwargs,
    )
    return report.sanity_checks


def _by_name(checks: list[SanityCheck]) -> dict[str, SanityCheck]:
    return {c.name: c for c in checks}


def test_all_checks_pass_on_a_real_model(tmp_path: Path, model: nn.Module) -> None:
    checks = _evaluate(
        tmp_path,
        model,
        [
            AttackSpec("fgsm", eps=[0, "4/255", "16/255"]),
            AttackSpec("pgd", eps=[0, "4/255", "16/255"], options={"steps": 10}),
            AttackSpec("pgd_l2", eps=[0, 0.5, 1.0], options={"steps": 10}),
            AttackSpec("cw", eps=[0, 0.5, 1.0], options={"steps": 20, "c": [1.0, 10.0]}),
            AttackSpec("gaussian_noise", eps=[0, 0.1]),
        ],
    )
    assert [c.name for c in checks] == ["gradients", "large_budget", "eps_zero", "monotonic", "budget"]
    assert all(c.passed and not c.skipped for c in checks), "\n".join(map(str, checks))
    assert "11 iterative" not in _by_name(checks)["monotonic"].detail  # 3 curves
    assert _by_name(checks)["monotonic"].detail.startswith("3 iterative curve(s), 9 point(s)")


def test_gradient_check_trips_on_masked_and_nan_gradients(model: nn.Module) -> None:
    images, labels = make_data(16, seed=2)
    assert check_gradients(model, images, labels).passed
    rounding = check_gradients(nn.Sequential(Round(), model).eval(), images, labels, name="rounding")
    assert (
        not rounding.passed and "zero for 16/16 samples" in rounding.detail and rounding.model == "rounding"
    )
    argmax = check_gradients(ArgmaxLogits(model).eval(), images, labels)
    assert not argmax.passed and "do not depend differentiably" in argmax.detail
    nan = check_gradients(NaNGradient(model).eval(), images, labels)
    assert not nan.passed and "NOT finite" in nan.detail


def test_gradient_check_runs_under_inference_mode(model: nn.Module) -> None:
    images, labels = make_data(8, seed=2)
    with torch.inference_mode():
        assert check_gradients(model, images, labels).passed
        assert check_large_budget(model, images, labels, num_classes=CLASSES).passed


def test_large_budget_check_trips_on_masked_gradients(model: nn.Module) -> None:
    images, labels = make_data(32, seed=3)
    good = check_large_budget(model, images, labels, num_classes=CLASSES)
    assert good.passed and "accuracy 0.000" in good.detail
    rounding = check_large_budget(nn.Sequential(Round(), model).eval(), images, labels, num_classes=CLASSES)
    assert not rounding.passed and "must be <= chance 0.250" in rounding.detail
    argmax = check_large_budget(ArgmaxLogits(model).eval(), images, labels, num_classes=CLASSES)
    assert not argmax.passed and "attack failed" in argmax.detail
    with pytest.raises(ValueError, match="expected num_classes >= 2"):
        check_large_budget(model, images, labels, num_classes=1)


def test_masked_model_trips_both_checks_in_a_full_run(tmp_path: Path, model: nn.Module) -> None:
    checks = _by_name(
        _evaluate(tmp_path, nn.Sequential(Round(), model).eval(), [AttackSpec("fgsm", eps=[0, 0.1])])
    )
    assert not checks["gradients"].passed and not checks["large_budget"].passed
    assert checks["eps_zero"].passed


def test_eps_zero_check_trips_on_a_randomised_model(tmp_path: Path, model: nn.Module) -> None:
    checks = _by_name(_evaluate(tmp_path, Randomised(model).eval(), [AttackSpec("fgsm", eps=[0])]))
    assert not checks["eps_zero"].passed
    assert "differ from the clean pass" in checks["eps_zero"].detail


def test_eps_zero_check_trips_on_a_broken_attack(tmp_path: Path, model: nn.Module) -> None:
    info = AttackInfo(
        "broken", lambda model, eps, **_: BrokenAttack(model, eps), "Linf", THREAT_FULL, True, "radius"
    )
    with registered_attack(info):
        checks = _by_name(_evaluate(tmp_path, model, [AttackSpec("broken", eps=[0, 0.3])]))
        assert not checks["eps_zero"].passed and "m/broken" in checks["eps_zero"].detail
        assert (
            not checks["budget"].passed
            and "at eps 0: max L-inf 0.3 exceeds the budget" in checks["budget"].detail
        )
        assert checks["gradients"].passed


def test_eps_zero_check_is_skipped_without_eps_zero(tmp_path: Path, model: nn.Module) -> None:
    check = _by_name(_evaluate(tmp_path, model, [AttackSpec("fgsm", eps=[0.1])]))["eps_zero"]
    assert check.passed and check.skipped and "skipped" in check.detail


def test_monotonicity_trips_on_fabricated_records() -> None:
    def curve(
        *points: tuple[float, int], attack: str = "pgd", iterative: bool = True
    ) -> list[RobustnessRecord]:
        return [
            RobustnessRecord.fabricate("m", attack, e, n=20, robust_correct=c, iterative=iterative)
            for e, c in points
        ]

    assert check_monotonic(curve((0, 18), (0.1, 10), (0.2, 11), (0.3, 4))).passed  # +1 sample: tolerated
    bad = check_monotonic(curve((0, 18), (0.1, 10), (0.2, 12)))
    assert not bad.passed and "12/20 correct at eps 0.2 > 10/20" in bad.detail
    creeping = check_monotonic(curve((0, 18), (0.1, 10), (0.2, 11), (0.3, 12)))  # the running minimum counts
    assert not creeping.passed
    assert check_monotonic(curve((0, 5), (0.1, 9), attack="fgsm", iterative=False)).skipped
    assert check_monotonic(curve((0, 18), (0.1, 18)), tolerance=0).passed  # equal is non-increasing
    assert not check_monotonic(curve((0, 18), (0.1, 19)), tolerance=0).passed
    # records of different bands are separate curves
    low = [RobustnessRecord.fabricate("m", "band", 0.1, n=20, robust_correct=5, band=[0.0, 0.25])]
    high = [RobustnessRecord.fabricate("m", "band", 0.2, n=20, robust_correct=15, band=[0.5, 1.0])]
    assert check_monotonic(low + high).passed
    with pytest.raises(ValueError, match="non-negative number of samples, got -1"):
        check_monotonic([], tolerance=-1)


def test_monotonicity_trips_on_a_crafted_model(tmp_path: Path) -> None:
    images = torch.full((16, 3, 8, 8), 0.5)
    data = DataLoader(TensorDataset(images, torch.zeros(16, dtype=torch.long)), batch_size=8)
    checks = _by_name(
        _evaluate(
            tmp_path,
            NoiseLover().eval(),
            [AttackSpec("pgd", eps=[0, "2/255", "8/255"], options={"steps": 2})],
            data=data,
        )
    )
    assert not checks["monotonic"].passed
    assert "16/16 correct at eps 0.03137 > 0/16 at a smaller eps" in checks["monotonic"].detail
    assert checks["eps_zero"].passed


def test_budget_check_on_fabricated_records() -> None:
    inside = RobustnessRecord.fabricate("m", "pgd", 0.1, max_linf=0.1 + 1e-7)
    assert check_budget([inside]).passed
    assert not check_budget([RobustnessRecord.fabricate("m", "pgd", 0.1, max_linf=0.11)]).passed
    l2 = RobustnessRecord.fabricate("m", "pgd_l2", 0.5, norm="L2", max_l2=0.6, max_linf=0.6)
    assert "max L2 0.6 exceeds" in check_budget([l2]).detail
    nan = RobustnessRecord.fabricate("m", "pgd", 0.1, max_l2=float("nan"))
    assert "non-finite" in check_budget([nan]).detail
    noise = RobustnessRecord.fabricate("m", "gaussian_noise", 0.1, norm=None, max_l2=3.0, max_linf=0.4)
    assert check_budget([noise]).passed


def test_eps_zero_on_fabricated_records() -> None:
    same = RobustnessRecord.fabricate("m", "pgd", 0.0, clean_correct=7, robust_correct=7)
    assert check_eps_zero([same]).passed
    # equal counts but different samples: still a failure
    swapped = RobustnessRecord.fabricate("m", "pgd", 0.0, clean_correct=7, robust_correct=7, flipped=2)
    assert not check_eps_zero([swapped]).passed
    other_model = RobustnessRecord.fabricate("x", "pgd", 0.0, clean_correct=7, robust_correct=6)
    assert check_eps_zero([same, other_model], model="m").passed


def test_strict_mode_raises_after_writing_everything(tmp_path: Path, model: nn.Module) -> None:
    out = tmp_path / "out"
    with pytest.raises(SanityCheckError, match="FAIL eps_zero") as error:
        evaluate_robustness(
            {"m": Randomised(model).eval()},
            loader(),
            [AttackSpec("fgsm", eps=[0])],
            out,
            heat_map=False,
            progress=False,
        )
    assert str(out) in str(error.value) and error.value.checks[0].name == "eps_zero"
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and len(results["records"]) == 1
    assert any(not c["passed"] for c in results["sanity_checks"])
    assert "**FAIL**" in (out / "summary.md").read_text()
