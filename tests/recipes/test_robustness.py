"""The robustness recipe end to end: validation before work, crash safety, determinism, outputs, CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_task import CLASSES, make_data, trained_linear_classifier
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchattacks.attack import Attack

from lightning_bandlimit.recipes.evaluation.evaluate import evaluate_robustness
from lightning_bandlimit.recipes.threats import (
    THREAT_BAND,
    THREAT_FULL,
    AttackInfo,
    AttackSpec,
    attack_names,
    registered_attack,
)

PACKAGED = Path(__file__).resolve().parents[2] / "lightning_bandlimit" / "configs" / "robustness.yaml"
STUDY = PACKAGED.parent / "robustness_study.yaml"


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return trained_linear_classifier()


def loader(n: int = 32, seed: int = 1, batch_size: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(*make_data(n, seed)), batch_size=batch_size)


def run(models: dict[str, Any], out: Path, attacks: list[AttackSpec], data: Any = None, **kwargs: Any):
    kwargs = {"heat_map": False, "progress": False, "strict": False, **kwargs}
    return evaluate_robustness(models, data if data is not None else loader(), attacks, out, **kwargs)


def _records(path: Path) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in r.items() if k != "seconds"}
        for r in json.loads((path / "results.json").read_text())["records"]
    ]


class Wrapped(nn.Module):
    def __init__(self, base: nn.Module, fn: Any) -> None:
        super().__init__()
        self.base, self.fn = base, fn

    def forward(self, x: torch.Tensor) -> Any:
        return self.fn(self.base(x))


# ------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        (
            "train_mode",
            ValueError,
            r"expected a model in eval mode .* got Sequential with 4 module\(s\) in training mode: <root>",
        ),
        (
            "vector",
            ValueError,
            r"expected logits of shape \(N, classes\) = \(16, classes >= 2\), got shape \(16,\)",
        ),
        ("one_class", ValueError, r"got shape \(16, 1\)"),
        ("tuple", ValueError, "expected logits .* got tuple"),
        ("probabilities", ValueError, "sum to 1 \\(probabilities\\): remove the final softmax"),
        ("nan", ValueError, "with finite values, got NaN or inf"),
        ("no_gradient", ValueError, "depend differentiably on the input"),
        ("labels", ValueError, r"expected labels in \[0, 4\) for its 4 logits, got labels in \[1, 7\]"),
        (
            "range",
            ValueError,
            (
                r"expected images in \[0, 1\] \(normalisation belongs inside the model\), got values in "
                r"\[-0\.\d+, 0\.\d+\] in batch 0"
            ),
        ),
        ("unknown_attack", ValueError, "unknown attack 'pgdd'; expected one of: autoattack,"),
        ("bad_eps", ValueError, r"distinct finite eps >= 0, got \[-0.1\]"),
        ("limit", ValueError, "limit must be >= 1, got 0"),
        ("device", ValueError, "expected device 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu0'"),
        ("data", TypeError, "expected a LightningDataModule or a DataLoader, got list"),
        ("checkpoint", FileNotFoundError, "checkpoint not found: '.*missing.ckpt'"),
        ("no_models", ValueError, "expected a non-empty mapping"),
    ],
)
def test_bad_input_fails_before_any_work(
    tmp_path: Path, model: nn.Module, case: str, error: type, message: str
) -> None:
    models: dict[str, Any] = {"m": model}
    data: Any = loader(16)
    attacks = [AttackSpec("fgsm", eps=[0, 0.1])]
    kwargs: dict[str, Any] = {}
    if case == "train_mode":
        models = {"m": nn.Sequential(nn.Flatten(), nn.Linear(192, 4), nn.Identity())}
    elif case in ("vector", "one_class", "tuple", "probabilities", "nan", "no_gradient"):
        fn = {
            "vector": lambda z: z.sum(1),
            "one_class": lambda z: z[:, :1],
            "tuple": lambda z: (z, z),
            "probabilities": lambda z: z.softmax(1),
            "nan": lambda z: z * float("nan"),
            "no_gradient": lambda z: nn.functional.one_hot(z.argmax(1), CLASSES).float() * 10,
        }[case]
        models = {"m": Wrapped(model, fn).eval()}
    elif case == "labels":
        images, labels = make_data(16)
        data = DataLoader(TensorDataset(images, labels * 2 + 1), batch_size=16)
    elif case == "range":
        images, labels = make_data(16)
        data = DataLoader(TensorDataset(images * 2 - 1, labels), batch_size=8)
    elif case == "unknown_attack":
        attacks = [AttackSpec("fgsm", eps=[0.1]), AttackSpec("pgdd", eps=[0.1])]
    elif case == "bad_eps":
        attacks = [AttackSpec("pgd", eps=[-0.1])]
    elif case == "limit":
        kwargs["limit"] = 0
    elif case == "device":
        kwargs["device"] = "gpu0"
    elif case == "data":
        data = [make_data(16)]
    elif case == "checkpoint":
        models = {"m": model, "other": str(tmp_path / "missing.ckpt")}
    elif case == "no_models":
        models = {}
    out = tmp_path / "out"
    with pytest.raises(error, match=message):
        run(models, out, attacks, data=data, **kwargs)
    assert not out.exists()


def test_existing_results_are_not_overwritten(tmp_path: Path, model: nn.Module) -> None:
    out = tmp_path / "out"
    run({"m": model}, out, [AttackSpec("fgsm", eps=[0.1])])
    before = (out / "results.json").read_text()
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        run({"m": model}, out, [AttackSpec("fgsm", eps=[0.2])])
    assert (out / "results.json").read_text() == before
    report = run({"m": model}, out, [AttackSpec("fgsm", eps=[0.2])], overwrite=True)
    assert [r.eps for r in report.records] == [0.2]


# ------------------------------------------------------------------------------------ robustness


class Flaky(Attack):
    """Fails on its second budget, like an attack that runs out of memory mid-sweep."""

    def __init__(self, model: nn.Module, eps: float) -> None:
        super().__init__("Flaky", model)
        self.eps = eps

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.eps == 0.2:
            raise RuntimeError("boom at the second eps")
        return images.clone()


def test_a_crash_mid_run_keeps_the_records(tmp_path: Path, model: nn.Module) -> None:
    info = AttackInfo("flaky", lambda model, eps, **_: Flaky(model, eps), "Linf", THREAT_FULL, True, "radius")
    with registered_attack(info):
        out = tmp_path / "out"
        with pytest.raises(RuntimeError, match="boom at the second eps"):
            run(
                {"m": model},
                out,
                [AttackSpec("fgsm", eps=[0, 0.1]), AttackSpec("flaky", eps=[0.1, 0.2, 0.3])],
            )
        results = json.loads((out / "results.json").read_text())
        assert results["status"] == "crashed" and "boom" in results["error"]
        assert [(r["attack"], r["eps"]) for r in results["records"]] == [
            ("fgsm", 0.0),
            ("fgsm", 0.1),
            ("flaky", 0.1),
        ]
        with (out / "results.csv").open() as stream:
            assert len(list(csv.DictReader(stream))) == 3
        assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_same_seed_same_records(tmp_path: Path, model: nn.Module) -> None:
    attacks = [
        AttackSpec("pgd", eps=[0, "8/255"], options={"steps": 3}),
        AttackSpec("gaussian_noise", eps=[0.2]),
        AttackSpec("band_noise", eps=[0.1], band="high"),
        AttackSpec("band_pgd_l2", eps=[0.5], band=[0.0, 0.5], options={"steps": 3}),
        AttackSpec("cw", eps=[0.5], options={"steps": 5, "c": [1.0]}),
    ]
    torch.manual_seed(1)
    run({"m": model}, tmp_path / "a", attacks, seed=3)
    torch.manual_seed(2)  # the caller's RNG state does not matter
    run({"m": model}, tmp_path / "b", attacks, seed=3)
    first = _records(tmp_path / "a")
    assert first == _records(tmp_path / "b")
    other = _records(run({"m": model}, tmp_path / "c", attacks, seed=4).output_dir)
    assert [r["seed"] for r in other] != [r["seed"] for r in first]


def test_eps_zero_reproduces_clean_accuracy_for_every_attack(tmp_path: Path, model: nn.Module) -> None:
    cheap = {
        "pgd": {"steps": 3},
        "pgd_l2": {"steps": 3},
        "cw": {"steps": 5, "c": [1.0]},
        "autoattack": {"steps": 2, "n_queries": 5, "n_target_classes": 1},
        "band_pgd": {"steps": 2},
        "band_pgd_l2": {"steps": 2},
    }
    attacks = [AttackSpec(name, eps=[0, 0.25], options=cheap.get(name, {})) for name in attack_names()]
    report = run({"m": model}, tmp_path / "out", attacks)
    zero = [r for r in report.records if r.eps == 0]
    assert len(zero) == len(attacks)
    for record in zero:
        assert record.robust_correct == record.clean_correct and record.flipped == 0, record.attack
        assert record.robust_accuracy == record.clean_accuracy
        assert record.mean_linf == 0 and record.max_l2 == 0
    assert all(c.passed for c in report.sanity_checks if c.name in ("eps_zero", "budget"))


def test_worst_case_is_at_most_every_attack(tmp_path: Path, model: nn.Module) -> None:
    attacks = [
        AttackSpec("fgsm", eps=["4/255", "16/255"]),
        AttackSpec("pgd", eps=["4/255", "16/255"], options={"steps": 5}),
        AttackSpec("pgd_l2", eps=[0.5], options={"steps": 5}),
        AttackSpec("cw", eps=[0.5, 2.0], options={"steps": 10, "c": [1.0, 10.0]}),
        AttackSpec("gaussian_noise", eps=[0.1]),
        AttackSpec("band_pgd", eps=["16/255"], band="low", options={"steps": 3}),
        AttackSpec("band_noise", eps=["16/255"], band="low"),
    ]
    report = run({"m": model, "copy": model}, tmp_path / "out", attacks)
    full = [w for w in report.worst_case if w.threat == THREAT_FULL]
    assert {(w.model, w.norm, round(w.eps, 6)) for w in full} == {
        (m, n, round(e, 6))
        for m in ("m", "copy")
        for n, e in [("Linf", 4 / 255), ("Linf", 16 / 255), ("L2", 0.5), ("L2", 2.0)]
    }
    for w in full:
        members = [
            r
            for r in report.records
            if r.model == w.model
            and r.norm == w.norm
            and abs(r.eps - w.eps) < 1e-12
            and r.threat == THREAT_FULL
        ]
        assert sorted(w.attacks) == sorted(r.attack for r in members)
        assert w.robust_accuracy <= min(r.robust_accuracy for r in members)
        assert w.robust_accuracy <= w.clean_accuracy
    l2 = next(w for w in full if w.model == "m" and w.norm == "L2" and w.eps == 0.5)
    assert sorted(l2.attacks) == ["cw", "pgd_l2"]
    band = [w for w in report.worst_case if w.threat == THREAT_BAND]
    assert [w.attacks for w in band if w.model == "m"] == [["band_pgd[low]"]]  # noise is not in a worst case
    # the two copies of one model give the same numbers
    by_model = {
        m: [(w.norm, w.eps, w.robust_correct) for w in report.worst_case if w.model == m]
        for m in ("m", "copy")
    }
    assert by_model["m"] == by_model["copy"]
    # one C&W run serves every budget, and its curve is monotone by construction
    cw = [r for r in report.records if r.attack == "cw" and r.model == "m"]
    assert cw[0].seconds == cw[1].seconds and cw[0].robust_correct >= cw[1].robust_correct


def test_runs_inside_inference_mode(tmp_path: Path, model: nn.Module) -> None:
    attacks = [
        AttackSpec("pgd", eps=[0, 0.1], options={"steps": 3}),
        AttackSpec("cw", eps=[0.5], options={"steps": 3}),
    ]
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    outside = run({"m": model}, tmp_path / "a", attacks)
    with torch.inference_mode():
        images, labels = make_data(32, seed=1)  # inference tensors, as a Lightning test loop makes them
        assert images.is_inference()
        inside = run(
            {"m": model},
            tmp_path / "b",
            attacks,
            data=DataLoader(TensorDataset(images, labels), batch_size=16),
        )
    assert [r.robust_correct for r in inside.records] == [r.robust_correct for r in outside.records]
    assert all(c.passed for c in inside.sanity_checks)
    assert all(p.requires_grad for p in model.parameters())  # frozen only while running
    for before, p in zip(grads, model.parameters()):  # C&W calls backward(): the models' .grad stay untouched
        assert (before is None and p.grad is None) or torch.equal(before, p.grad)


def test_report_files(tmp_path: Path, model: nn.Module) -> None:
    report = run(
        {"plain": model},
        tmp_path / "out",
        [
            AttackSpec("pgd", eps=[0, "8/255"], options={"steps": 3}),
            AttackSpec("band_pgd", eps=[0, "8/255"], band="high", options={"steps": 2}),
            AttackSpec("gaussian_noise", eps=[0, 0.1]),
        ],
        seed=5,
    )
    out = report.output_dir
    assert {p.name for p in out.iterdir()} == {
        "results.json",
        "results.csv",
        "accuracy_vs_eps.png",
        "summary.md",
    }
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and results["seed"] == 5 and results["n_samples"] == 32
    assert {"torch", "torchattacks", "lightning", "torchmetrics"} <= set(results["versions"])
    assert results["config"]["attacks"][0]["options_resolved"]["steps"] == 3
    record = results["records"][1]
    assert {
        "model",
        "attack",
        "eps",
        "band",
        "clean_accuracy",
        "robust_accuracy",
        "mean_l2",
        "mean_linf",
        "n",
        "seconds",
    } <= set(record)
    assert results["records"][3]["band"] == [0.5, 1.0]
    summary = (out / "summary.md").read_text()
    assert summary == report.summary
    assert (
        "full-spectrum (adaptive white-box)" in summary
        and "band-restricted (white-box, band high (0.5-1))" in summary
    )
    assert "trivially insensitive" in summary and "random noise" in summary
    assert "Robust accuracy (per-sample worst case over full-spectrum attacks)" in summary
    assert (out / "accuracy_vs_eps.png").read_bytes()[:4] == b"\x89PNG"
