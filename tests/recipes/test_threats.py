"""The attack registry: names, metadata, full-strength defaults, validation, seeds."""

from __future__ import annotations

import math

import pytest
import torch
import torchattacks
from torch import nn

from lightning_bandlimit.recipes.threats import (
    ATTACKS,
    THREAT_BAND,
    THREAT_FULL,
    THREAT_NOISE,
    AttackInfo,
    AttackSpec,
    CWMinNorm,
    attack_names,
    build_attack,
    derive_seed,
    register_attack,
    registered_attack,
    spec_band,
    spec_norm,
    unregister_attack,
    validate_attack_specs,
)

REQUIRED = {
    "fgsm",
    "pgd",
    "pgd_l2",
    "cw",
    "autoattack",
    "gaussian_noise",
    "band_pgd",
    "band_pgd_l2",
    "band_noise",
}
CHEAP = {  # options that keep each attack to a few model calls
    "pgd": {"steps": 3},
    "pgd_l2": {"steps": 3},
    "cw": {"steps": 5, "c": [1.0]},
    "autoattack": {"steps": 2, "n_queries": 5, "n_target_classes": 1},
    "band_pgd": {"steps": 3},
    "band_pgd_l2": {"steps": 3},
}


def _model(classes: int = 4) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, classes)).eval()


def _batch(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, 3, 8, 8) * 0.8 + 0.1, torch.arange(n) % 4


def test_registry_has_the_required_attacks_with_metadata() -> None:
    assert REQUIRED <= set(attack_names())
    expected = {
        "fgsm": ("Linf", THREAT_FULL, False),
        "pgd": ("Linf", THREAT_FULL, True),
        "pgd_l2": ("L2", THREAT_FULL, True),
        "cw": ("L2", THREAT_FULL, True),
        "autoattack": ("Linf", THREAT_FULL, True),
        "gaussian_noise": (None, THREAT_NOISE, False),
        "band_pgd": ("Linf", THREAT_BAND, True),
        "band_pgd_l2": ("L2", THREAT_BAND, True),
        "band_noise": ("Linf", THREAT_NOISE, False),
    }
    for name, (norm, threat, iterative) in expected.items():
        info = ATTACKS[name]
        assert (info.norm, info.threat, info.iterative) == (norm, threat, iterative), name
        assert info.eps_meaning
    assert ATTACKS["cw"].minimum_norm and not ATTACKS["pgd"].minimum_norm
    assert {n for n in ATTACKS if ATTACKS[n].banded} == {"band_pgd", "band_pgd_l2", "band_noise"}


def test_spec_parses_fractions_and_rejects_garbage() -> None:
    spec = AttackSpec("pgd", eps=[0, "8/255", 0.5, "1e-3"])
    assert spec.eps == [0.0, 8 / 255, 0.5, 0.001]
    assert AttackSpec("pgd", eps=0.1).eps == [0.1]  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'eight'"):
        AttackSpec("pgd", eps=["eight"])
    with pytest.raises(TypeError, match="True"):
        AttackSpec("pgd", eps=[True])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="None"):
        AttackSpec("pgd", eps=[None])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (AttackSpec("pgdd", eps=[0.1]), "unknown attack 'pgdd'; expected one of: autoattack, band_noise"),
        (AttackSpec("pgd", eps=[]), r"non-empty .*\[\]"),
        (AttackSpec("pgd", eps=[-0.1]), r">= 0, got \[-0.1\]"),
        (AttackSpec("pgd", eps=[math.nan]), "finite"),
        (AttackSpec("pgd", eps=[0.1, 0.1]), "distinct"),
        (AttackSpec("fgsm", eps=[2.0]), "L-inf eps above 1 .*2.0"),
        (AttackSpec("pgd", eps=[0.1], band="high"), "takes no band .*'high'"),
        (AttackSpec("band_pgd", eps=[0.1], band="ultra"), "'ultra'"),
        (AttackSpec("band_pgd", eps=[0.1], band=[0.6, 0.2]), "low < high .*0.6"),
        (
            AttackSpec("pgd", eps=[0.1], options={"stepz": 3}),
            r"unknown options \['stepz'\]; accepted: alpha, random_start, steps",
        ),
        (AttackSpec("pgd", eps=[0.1], options={"eps": 3}), "eps comes from the eps list"),
        (
            AttackSpec("autoattack", eps=[0.1], options={"norm": "L1"}),
            "expected norm 'Linf' or 'L2', got 'L1'",
        ),
    ],
)
def test_bad_specs_are_value_errors(spec: AttackSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_attack_specs([spec])


def test_validation_of_lists_and_labels() -> None:
    with pytest.raises(ValueError, match="non-empty list of attack specifications"):
        validate_attack_specs([])
    with pytest.raises(ValueError, match=r"labels must be unique, got \['pgd'\]"):
        validate_attack_specs([AttackSpec("pgd", eps=[0.1]), AttackSpec("pgd", eps=[0.2])])
    specs = validate_attack_specs(
        [
            AttackSpec("pgd", eps=[0.1]),
            AttackSpec("pgd", eps=[0.2], label="pgd-10", options={"steps": 10}),
            {"name": "band_pgd", "eps": ["4/255"], "band": [0.2, 0.6]},
            {"name": "band_pgd", "eps": [0.1]},
        ]
    )
    assert [s.key for s in specs] == ["pgd", "pgd-10", "band_pgd[0.2-0.6]", "band_pgd[high]"]
    assert spec_band(specs[2]) == (0.2, 0.6) and spec_band(specs[3]) == (0.5, 1.0)
    assert spec_norm(AttackSpec("gaussian_noise", eps=[0.1])) is None


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_attack_builds_runs_and_respects_its_budget(name: str) -> None:
    model = _model()
    images, labels = _batch()
    eps = 0.5 if ATTACKS[name].norm == "L2" else 8 / 255
    spec = validate_attack_specs([AttackSpec(name, eps=[eps], options=CHEAP.get(name, {}))])[0]
    attack = build_attack(spec, model, eps, num_classes=4, seed=1)
    assert isinstance(attack, torchattacks.attack.Attack)
    adv = attack(images, labels)
    assert adv.shape == images.shape and adv.isfinite().all()
    assert adv.min() >= 0 and adv.max() <= 1
    delta = (adv - images).flatten(1)
    norm = spec_norm(spec)
    if name == "cw":
        return  # minimum-norm: unbounded by design (evaluated at a budget by the recipe)
    if norm == "Linf":
        assert delta.abs().max() <= eps + 1e-6
    elif norm == "L2":
        assert delta.norm(dim=1).max() <= eps + 1e-5
    if ATTACKS[name].banded:
        assert attack.band == (0.5, 1.0)


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_eps_zero_returns_the_clean_images(name: str) -> None:
    model = _model()
    images, labels = _batch()
    spec = AttackSpec(name, eps=[0.0], options=CHEAP.get(name, {}))
    adv = build_attack(spec, model, 0.0, num_classes=4, seed=0)(images, labels)
    if name == "cw":  # no budget: eps = 0 is applied by the recipe when counting
        assert adv.isfinite().all()
        return
    assert torch.equal(adv, images), name  # torchattacks' PGDL2 alone would give NaN here


def test_pgd_defaults_are_full_strength() -> None:
    model = _model()
    pgd = build_attack(AttackSpec("pgd", eps=[8 / 255]), model, 8 / 255, num_classes=4, seed=0)
    assert (pgd.steps, pgd.random_start) == (50, True)
    assert pgd.alpha == pytest.approx(2.5 * (8 / 255) / 50)
    l2 = build_attack(
        AttackSpec("pgd_l2", eps=[0.5], options={"steps": 20}), model, 0.5, num_classes=4, seed=0
    )
    assert (l2.steps, l2.alpha) == (20, pytest.approx(2.5 * 0.5 / 20))
    custom = build_attack(
        AttackSpec("pgd", eps=[0.1], options={"alpha": 0.01}), model, 0.1, num_classes=4, seed=0
    )
    assert custom.alpha == 0.01
    noise = build_attack(AttackSpec("gaussian_noise", eps=[0.07]), model, 0.07, num_classes=4, seed=0)
    assert isinstance(noise, torchattacks.GN) and noise.std == 0.07
    cw = build_attack(AttackSpec("cw", eps=[0.5]), model, 0.5, num_classes=4, seed=0)
    assert isinstance(cw, CWMinNorm) and (cw.c, cw.steps) == ((0.1, 1.0, 10.0), 100)


def test_autoattack_runs_at_the_reference_strength() -> None:
    model = _model(classes=7)
    attack = build_attack(AttackSpec("autoattack", eps=[8 / 255]), model, 8 / 255, num_classes=7, seed=123)
    assert isinstance(attack, torchattacks.AutoAttack)
    assert (attack.version, attack.n_classes, attack.seed, attack.norm) == ("standard", 7, 123, "Linf")
    inner = {type(a).__name__: a for a in attack._autoattack.attacks}
    assert list(inner) == ["APGD", "APGDT", "FAB", "Square"]
    assert inner["APGD"].steps == inner["APGDT"].steps == inner["FAB"].steps == 100
    assert inner["APGDT"].n_target_classes == inner["FAB"].n_target_classes == 6
    assert inner["Square"].n_queries == 5000
    assert all(a.seed == 123 for a in inner.values())
    assert inner["FAB"].multi_targeted
    l2 = build_attack(
        AttackSpec("autoattack", eps=[0.5], options={"norm": "L2", "steps": 20}),
        model,
        0.5,
        num_classes=7,
        seed=0,
    )
    assert all(a.norm == "L2" for a in l2._autoattack.attacks)
    assert l2._autoattack.attacks[0].steps == 20
    for options, error, match in (
        ({"n_target_classes": 9}, ValueError, r"n_target_classes .*\[1, 6\], got 9"),
        ({"n_queries": 0}, ValueError, "n_queries .*0"),
        ({"steps": 2.5}, TypeError, "steps .*2.5"),
    ):
        with pytest.raises(error, match=match):
            build_attack(
                AttackSpec("autoattack", eps=[0.1], options=options), model, 0.1, num_classes=7, seed=0
            )


def test_cw_keeps_the_smallest_successful_perturbation() -> None:
    torch.manual_seed(0)
    model = _model()
    images, _ = _batch(8)
    labels = model(images).argmax(1)
    single = CWMinNorm(model, c=[10.0], steps=30)(images, labels)
    grid = CWMinNorm(model, c=[1.0, 10.0, 100.0], steps=30)(images, labels)

    def fooled(adv: torch.Tensor) -> torch.Tensor:
        return model(adv).argmax(1) != labels

    def l2(adv: torch.Tensor) -> torch.Tensor:
        return (adv - images).flatten(1).norm(dim=1)

    assert fooled(grid).sum() >= fooled(single).sum() > 0
    both = fooled(grid) & fooled(single)
    assert (l2(grid)[both] <= l2(single)[both] + 1e-6).all()
    assert torch.equal(grid[~fooled(grid)], images[~fooled(grid)])  # unfooled samples stay clean
    with pytest.raises(ValueError, match="c .*0.0"):
        CWMinNorm(model, c=[0.0])
    with pytest.raises(ValueError, match="c .*\\[\\]"):
        CWMinNorm(model, c=[])
    with pytest.raises(ValueError, match="steps .*0"):
        CWMinNorm(model, steps=0)
    with pytest.raises(ValueError, match="lr .*-1"):
        CWMinNorm(model, lr=-1)
    with pytest.raises(TypeError, match="steps .*2.5"):
        CWMinNorm(model, steps=2.5)


def test_same_seed_same_adversarials() -> None:
    model = _model()
    images, labels = _batch()
    spec = AttackSpec("pgd", eps=[8 / 255], options={"steps": 3})

    def run(seed: int) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build_attack(spec, model, 8 / 255, num_classes=4, seed=seed)(images, labels)

    assert torch.equal(run(derive_seed(0, "pgd", 8 / 255)), run(derive_seed(0, "pgd", 8 / 255)))
    assert not torch.equal(run(derive_seed(0, "pgd", 8 / 255)), run(derive_seed(1, "pgd", 8 / 255)))
    assert derive_seed(0, "pgd", 0.1) == 345431693  # stable across processes and machines


def test_register_attack_refuses_duplicates() -> None:
    info = AttackInfo("fgsm", ATTACKS["fgsm"].build, "Linf", THREAT_FULL, False, "step")
    with pytest.raises(ValueError, match="registered already"):
        register_attack(info)
    with pytest.raises(ValueError, match="expected norm in"):
        AttackInfo("x", ATTACKS["fgsm"].build, "L1", THREAT_FULL, False, "step")


def test_registered_attack_is_undone_and_unregister_attack_removes() -> None:
    fgsm = ATTACKS["fgsm"]
    copy = AttackInfo("fgsm_copy", fgsm.build, "Linf", THREAT_FULL, False, "step")
    with registered_attack(copy):
        assert ATTACKS["fgsm_copy"] is copy and "fgsm_copy" in attack_names()
    assert "fgsm_copy" not in ATTACKS
    stronger = AttackInfo("fgsm", fgsm.build, "Linf", THREAT_FULL, True, "step")
    with registered_attack(stronger, replace=True):
        assert ATTACKS["fgsm"] is stronger
    assert ATTACKS["fgsm"] is fgsm  # the built-in is back
    register_attack(copy)
    assert unregister_attack("fgsm_copy") is copy and "fgsm_copy" not in ATTACKS
    with pytest.raises(KeyError, match="fgsm_copy"):
        unregister_attack("fgsm_copy")
