"""The robustness recipe with threat models in a model's own band, and several replicates per variant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_task import CLASSES, fit, make_data
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_bandlimit.layers.surgery import bandlimit
from lightning_bandlimit.recipes.evaluation.evaluate import evaluate_robustness
from lightning_bandlimit.recipes.threats import AttackSpec, build_attack, validate_attack_specs
from lightning_bandlimit.recipes.threats.band_attacks import BandNoise, BandPGD
from lightning_bandlimit.recipes.threats.input_band import input_band


def cnn(seed: int, compression: float | None) -> nn.Module:
    """A small CNN trained on the tiny task; band-limited (input layer included) when ``compression``."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(24, CLASSES),
    )
    if compression is not None:
        bandlimit(net, compression)
    return fit(net, 128, seed, 40, 0.03)


@pytest.fixture(scope="module")
def variants() -> dict[str, list[nn.Module]]:
    return {"bl": [cnn(s, 0.6) for s in (0, 1)], "fs": [cnn(s, None) for s in (0, 1)]}


def loader() -> DataLoader:
    return DataLoader(TensorDataset(*make_data(24, seed=5)), batch_size=12)


ATTACKS = [
    AttackSpec("band_noise", eps=[0, 0.2, 0.4], band="dropped"),
    AttackSpec(
        "band_noise", eps=[0, 2.0], band="dropped", options={"norm": "L2"}, label="band_noise_l2[dropped]"
    ),
    AttackSpec("band_pgd", eps=[0, 0.1], band="dropped", options={"steps": 3}),
    AttackSpec("band_noise", eps=[0, 0.2], band="kept"),
    AttackSpec("pgd", eps=[0, 0.05], options={"steps": 3}),
]


def run(models: dict[str, Any], out: Path, attacks: list[AttackSpec] = ATTACKS, **kwargs: Any):
    kwargs = {"heat_map": False, "progress": False, "strict": False, **kwargs}
    return evaluate_robustness(models, loader(), attacks, out, **kwargs)


def test_band_attacks_take_a_model_band() -> None:
    model = cnn(0, 0.6)
    band = input_band(model, (3, 8, 8))
    images, labels = make_data(8, seed=3)
    for attack in (
        BandNoise(model, eps=0.3, band=band.dropped, seed=0),
        BandPGD(model, eps=0.3, alpha=0.1, steps=3, band=band.dropped),
    ):
        delta = attack(images, labels) - images
        assert float(delta.abs().max()) <= 0.3 + 1e-6
        assert torch.allclose(band.dropped.project(delta.double()).float(), delta, atol=1e-5)
        assert attack.band is band.dropped
    noise = BandNoise(model, eps=0.3, band=band.dropped, seed=0)(images) - images
    assert float(noise.abs().amax(dim=(1, 2, 3)).min()) > 0.2  # the budget is used, not shrunk away
    plain = cnn(0, None)
    with torch.no_grad():  # the model cannot see it, a full-spectrum one can
        assert torch.allclose(model(images + noise), model(images), atol=1e-5)
        assert (plain(images + noise) - plain(images)).abs().max() > 1e-2


def test_specs_with_a_model_band() -> None:
    (spec,) = validate_attack_specs([{"name": "band_pgd", "eps": [0.1], "band": "dropped", "band_of": "bl"}])
    assert spec.key == "band_pgd[dropped@bl]"
    assert AttackSpec("band_noise", eps=[0.1], band="kept").key == "band_noise[kept]"
    with pytest.raises(ValueError, match="band_of names the model whose band is"):
        validate_attack_specs([{"name": "band_pgd", "eps": [0.1], "band": "high", "band_of": "bl"}])
    with pytest.raises(ValueError, match="or a model's band: dropped, kept"):
        validate_attack_specs([{"name": "band_pgd", "eps": [0.1], "band": "droped"}])
    with pytest.raises(
        ValueError, match=r"band 'dropped' is a model's; expected the subspace InputBand.dropped"
    ):
        build_attack(spec, nn.Linear(2, 2), 0.1, num_classes=2, seed=0)


def test_replicates_and_the_dropped_band(tmp_path: Path, variants: dict[str, list[nn.Module]]) -> None:
    report = run(variants, tmp_path, heat_map=True, heat_map_limit=8)
    models = {r.model for r in report.records}
    assert models == {"bl#0", "bl#1", "fs#0", "fs#1"}
    assert {(r.variant, r.replicate) for r in report.records} == {("bl", 0), ("bl", 1), ("fs", 0), ("fs", 1)}
    dropped = [r for r in report.records if r.band_name == "dropped"]
    assert dropped and all(r.band_source == "bl" for r in dropped)
    for r in dropped:
        if r.variant == "bl":  # exactly what its input layer ignores: nothing changes
            assert r.robust_correct == r.clean_correct and r.flipped == 0
        if r.eps > 0 and r.attack_name == "band_noise":
            assert r.mean_l2 > 0
    # Every model faces the same noise: the same seed per attack and eps, and one subspace.
    noise = {(r.model, r.attack, r.eps): r.mean_l2 for r in dropped if r.attack_name == "band_noise"}
    for (model, attack, eps), l2 in noise.items():
        assert l2 == pytest.approx(noise[("bl#0", attack, eps)], rel=1e-6)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Per variant (accuracy in %, mean +- std over replicates)" in summary
    assert "## Paired differences: bl minus fs" in summary
    assert "* **dropped-band noise** (Linf):" in summary and "* **dropped-band noise** (L2):" in summary
    assert "* **full-spectrum adaptive** (Linf):" in summary
    assert "random noise, band-restricted (dropped by bl's input layer)" in summary
    assert (tmp_path / "heat_map_difference.png").stat().st_size > 0
    assert report.paths["heat_map_difference"] == tmp_path / "heat_map_difference.png"
    config = json.loads((tmp_path / "results.json").read_text())["config"]
    assert config["models"]["bl#1"]["input_band"]["dropped_dims"] > 0
    assert config["models"]["fs#0"]["input_band"]["dropped_dims"] == 0
    assert config["attacks"][0]["band_source"].startswith("model 'bl#0' (input layer '0'")


def test_the_source_can_be_named_and_is_checked(tmp_path: Path, variants: dict[str, list[nn.Module]]) -> None:
    spec = AttackSpec("band_noise", eps=[0, 0.2], band="dropped", band_of="bl")
    report = run(variants, tmp_path / "named", [spec])
    assert {r.attack for r in report.records} == {"band_noise[dropped@bl]"}
    with pytest.raises(
        ValueError, match=r"expected band_of to name an evaluated model, one of \['bl', 'fs'\], got 'x'"
    ):
        run(variants, tmp_path / "x", [AttackSpec("band_noise", eps=[0.2], band="dropped", band_of="x")])
    with pytest.raises(ValueError, match=r"the dropped band of 'fs' is empty .* keeps every frequency"):
        run(variants, tmp_path / "fs", [AttackSpec("band_noise", eps=[0.2], band="dropped", band_of="fs")])
    with pytest.raises(
        ValueError, match=r"needs its source model; expected band_of: one of \['fs'\], got no band_of"
    ):
        run({"fs": variants["fs"]}, tmp_path / "none", [AttackSpec("band_noise", eps=[0.2], band="dropped")])
    mixed = {"bl": [variants["bl"][0], cnn(1, 0.85)], "fs": variants["fs"]}
    with pytest.raises(
        ValueError, match=r"expected the replicates of 'bl' to share one input band, got \['bl#1'\]"
    ):
        run(mixed, tmp_path / "mixed", [AttackSpec("band_noise", eps=[0.2], band="dropped")])
    with pytest.raises(ValueError, match="expected at least one checkpoint or module for variant 'bl'"):
        run({"bl": [], "fs": variants["fs"]}, tmp_path / "empty", [AttackSpec("pgd", eps=[0.1])])
    assert not (tmp_path / "x").exists()  # refused before any work
