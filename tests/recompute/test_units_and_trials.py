"""Units for every family, container arguments frozen, and the trial that proves a unit exact."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
import torchvision
from torch import nn

from lightning_bandlimit import bandlimit
from lightning_bandlimit.recompute.arguments import checkpoint_call
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.segments import Segment
from lightning_bandlimit.recompute.switch import checkpoint, uncheckpoint
from lightning_bandlimit.recompute.trial import float32_eps, trial
from lightning_bandlimit.recompute.unit_choice import checkpoint_units

trial_module = importlib.import_module(
    "lightning_bandlimit.recompute.trial"
)  # the package exports the function


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    torch.manual_seed(1)
    model.zero_grad()
    model(x).square().sum().backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _all_units_exact(model: nn.Module, x: torch.Tensor) -> int:
    units = checkpoint_units(model)
    state = copy.deepcopy(model.state_dict())
    plain = _grads(model, x)
    model.load_state_dict(state)
    for name, unit in units:
        checkpoint(unit, name)
    checked = _grads(model, x)
    for a, b in zip(plain, checked, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    for _, unit in units:
        uncheckpoint(unit)
    return len(units)


def test_densenet_layers_are_units_and_recompute_what_their_forward_saw() -> None:
    # _DenseBlock appends to the list it passed its layer: the recompute must not see the new feature
    model = torchvision.models.densenet121(num_classes=4).double().train()
    units = [n for n, _ in checkpoint_units(model)]
    assert units[0] == "features.denseblock1.denselayer1" and len(units) == 58
    assert _all_units_exact(model, torch.randn(2, 3, 32, 32, dtype=torch.float64)) == 58


def test_a_container_argument_changed_after_the_call_does_not_change_the_recompute() -> None:
    conv = nn.Conv2d(2, 3, 3).double()
    features = [torch.randn(2, 1, 6, 6, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    fn = lambda xs: conv(torch.cat(xs, 1)).relu()  # noqa: E731
    out = checkpoint_call(fn, (features,), {}, torch.utils.checkpoint.noop_context_fn, "conv")
    features.append(torch.randn(2, 1, 6, 6, dtype=torch.float64))
    out.sum().backward()
    expected = torch.autograd.grad(fn(features[:2]).sum(), conv.weight)[0]
    torch.testing.assert_close(conv.weight.grad, expected)


def test_self_checkpointing_modules_are_not_checkpointed_twice() -> None:
    efficient = torchvision.models.densenet121(num_classes=4, memory_efficient=True)
    assert all("denselayer" not in n for n, _ in checkpoint_units(efficient))


@pytest.mark.parametrize(
    ("build", "first", "count"),
    [
        (lambda: torchvision.models.vgg11_bn(num_classes=4), "features[0:4]", 5),
        (lambda: torchvision.models.alexnet(num_classes=4), "features[0:3]", 3),
        (lambda: torchvision.models.convnext_tiny(num_classes=4), "features.1.0", 18),
        (lambda: torchvision.models.regnet_y_400mf(num_classes=4), "trunk_output.block1.block1-0", 16),
    ],
)
def test_every_family_has_units(build, first: str, count: int) -> None:
    units = [n for n, _ in checkpoint_units(build())]
    assert units[0] == first and len(units) == count


def test_a_users_module_holding_a_chain_gets_segments_not_one_whole_network_unit() -> None:
    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = torchvision.models.vgg11(num_classes=4)

    names = [n for n, _ in checkpoint_units(Wrapper())]
    assert names[0] == "model.features[0:3]" and "model" not in names
    lone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3))  # one chain, no pool: the whole network
    assert checkpoint_units(nn.Sequential(lone, nn.Flatten())) == []


def test_segments_are_exact_and_switch_back() -> None:
    model = torchvision.models.vgg11_bn(num_classes=4).double().train()
    # the segments are the features'; the 120M-parameter head (2 GB in float64, several copies in
    # the trials) is swapped for one small layer, which keeps this test's peak near 1 GB
    model.classifier = nn.Linear(512 * 7 * 7, 4).double()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    assert _all_units_exact(model, torch.randn(2, 3, 32, 32, dtype=torch.float64)) == 5
    assert type(model.features) is nn.Sequential
    stages = CheckpointRungs(checkpoint_units(model))
    with stages.profile(exclude=model.parameters()) as profile:
        model(torch.randn(2, 3, 32, 32, dtype=torch.float64))
    stages.set_stages(profile.stages())
    assert len(stages.stages) == 5
    stages.apply(2)
    assert stages.checkpointed() == ["features[0:4]", "features[4:8]"]
    assert type(model.features).__name__ == "SegmentedSequential"
    stages.apply(0)
    assert type(model.features) is nn.Sequential


def test_segment_checks_its_chain() -> None:
    with pytest.raises(TypeError, match="plain nn.Sequential"):
        Segment(nn.Conv2d(1, 1, 1), 0, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside a chain of 2"):
        Segment(nn.Sequential(nn.ReLU(), nn.ReLU()), 1, 3)


class _Counter(nn.Module):
    """Not recomputable: its forward depends on how often it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.conv(x) * self.calls


class _Wobble(_Counter):
    """Its recompute differs by a thousandth: beyond float32's tolerance, within bf16's precision."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.conv(x) * (1 + 1e-3 * self.calls)


def test_trial_accepts_exact_units_and_rejects_a_unit_whose_recompute_differs() -> None:
    x = torch.randn(4, 2, 6, 6, requires_grad=True)
    block = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU(), nn.Dropout(0.5))
    before = copy.deepcopy(block.state_dict())
    assert trial("block", block, (x,)) is None
    for key, value in block.state_dict().items():  # statistics left as they were
        torch.testing.assert_close(value, before[key])
    reason = trial("counter", _Counter(), (x,))
    assert reason is not None and reason.startswith("counter: checkpointed")


def test_trial_judges_samples_recorded_under_bf16_autocast_under_that_autocast() -> None:
    # a bf16-mixed job records bf16 inputs of float32 units: run plainly outside autocast they
    # raise, and the trial had nothing to judge (every unit passed untried)
    x = torch.randn(4, 2, 6, 6).bfloat16().requires_grad_()
    block = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU())
    assert trial("counter", _Counter(), (x,)) is None  # without the autocast: not judged
    bf16 = ("cpu", torch.bfloat16)
    assert trial("block", block, (x,), autocast=bf16) is None
    reason = trial("counter", _Counter(), (x,), autocast=bf16)
    assert reason is not None and reason.startswith("counter: checkpointed")
    # a difference below bf16's precision (a GPU's backward summing in another order) passes
    # under bf16 autocast, not in float32
    assert trial("wobble", _Wobble(), (x,), autocast=bf16) is None
    assert trial("wobble", _Wobble(), (x.float().detach().requires_grad_(),)) is not None


class _Ripple(_Counter):
    """Its recompute differs by ``step`` (5e-4: a TF32 unit, what an H100 showed for conv blocks
    recomputed from a band-limited spectrum, 2e-4 to 8e-4 of scale)."""

    def __init__(self, step: float = 5e-4) -> None:
        super().__init__()
        self.step = step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.conv(x) * (1 + self.step * self.calls)


def test_float32_eps_follows_the_gpus_tf32_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    assert float32_eps(torch.device("cpu"), torch.float32) == 0.0
    assert float32_eps(cuda, torch.float64) == 0.0
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert float32_eps(cuda, torch.float32) == 2.0**-10  # cuDNN's default: convolutions in TF32
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert float32_eps(cuda, torch.float32) == 0.0  # IEEE float32 throughout
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert float32_eps(cuda, torch.float32) == 2.0**-10
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
    assert float32_eps(cuda, torch.float32) == torch.finfo(torch.bfloat16).eps


def test_trial_allows_a_tf32_unit_of_difference_where_the_device_computes_in_tf32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # on an H100 (fp32, cuDNN's default TF32) 6 of the quickstart model's 8 units differed by
    # 2e-4 to 8e-4 of scale recomputed at compression 0.5 and left the ladder: a rung of 24 MiB
    # where the CPU has four
    x = torch.randn(4, 2, 6, 6, requires_grad=True)
    assert trial("ripple", _Ripple(), (x,)) is not None  # IEEE float32: beyond its rounding
    monkeypatch.setattr(trial_module, "float32_eps", lambda device, dtype: 2.0**-10)  # as on a TF32 GPU
    assert trial("ripple", _Ripple(), (x,)) is None
    reason = trial("drift", _Ripple(1e-2), (x,))  # beyond TF32's four units (3.9e-3)
    assert reason is not None and reason.startswith("drift: checkpointed")
    assert trial("counter", _Counter(), (x,)) is not None


def test_trial_runs_band_limited_units_at_the_compression_asked_and_restores_it() -> None:
    model = bandlimit(torchvision.models.resnet18(num_classes=4), 0.0)
    block = model.layer1[0]
    assert trial("layer1.0", block, (torch.randn(4, 64, 8, 8, requires_grad=True),), compression=0.5) is None
    assert block.conv1.compression == 0.0
