"""What each stage frees, measured from a checkpointed profile's samples, against a plain profile."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torchvision
from torch import nn

from lightning_bandlimit.models import cifar_resnet18
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.sampled_savings import sampled_savings
from lightning_bandlimit.recompute.unit_choice import checkpoint_units


def _profiles(
    make: Callable[[], nn.Module], x: torch.Tensor, bf16: bool
) -> tuple[list[int], list[int], list[int], list[int]]:
    """A plain profile's savings and the stages' input bytes; sampled savings of a plain and of a
    checkpointed profile of the same batch (channels_last; under bf16 autocast with ``bf16``)."""
    torch.manual_seed(0)
    model = make().to(memory_format=torch.channels_last)
    x = x.to(memory_format=torch.channels_last)
    stages = CheckpointRungs(checkpoint_units(model))
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    with cast, stages.profile(exclude=model.parameters(), record=4) as plain:
        loss = model(x).float().sum()
    loss.backward()
    inputs = [sum(plain.input_bytes[n] for n in stage) for stage in plain.stages()]
    from_plain = sampled_savings(stages, plain)  # outside autocast, as a callback's batch end is
    with cast, stages.profile(exclude=model.parameters(), checkpointed=True, record=4) as checkpointed:
        model(x).float().sum()
    assert checkpointed.savings() == [0] * len(inputs)  # a checkpointed unit keeps only its input
    from_checkpointed = sampled_savings(stages, checkpointed)
    assert from_plain is not None and from_checkpointed is not None
    return plain.savings(), inputs, from_plain, from_checkpointed


def _small_head_vgg11() -> nn.Module:
    """VGG-11 with one small layer for its head: the stages are the features'; the 120M-parameter
    head (its weights and gradients about 1 GB) would only raise the test's peak."""
    model = torchvision.models.vgg11(num_classes=10)
    model.classifier = nn.Linear(512 * 7 * 7, 10)
    return model


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize(
    ("make", "shape"),
    [
        (lambda: cifar_resnet18(width=8), (32, 3, 32, 32)),
        (lambda: torchvision.models.resnet18(num_classes=10), (8, 3, 64, 64)),
        (_small_head_vgg11, (8, 3, 64, 64)),
    ],
    ids=["cifar_resnet18", "resnet18", "vgg11"],
)
def test_sampled_savings_bound_the_plain_profile_within_one_input(
    make: Callable[[], nn.Module], shape: tuple[int, ...], bf16: bool
) -> None:
    plain, inputs, from_plain, from_checkpointed = _profiles(make, torch.rand(shape), bf16)
    assert from_checkpointed == from_plain  # the samples are the same whichever way the units ran
    slack = 0.005 * sum(plain)  # a few per-call bytes (BatchNorm's statistics) measured apart
    for measured, stage_input, sampled in zip(plain, inputs, from_checkpointed, strict=True):
        # at least what the plain profile counts, at most that plus the input
        assert measured - slack <= sampled <= measured + stage_input + slack


def test_sampled_savings_scale_with_the_batch_and_leave_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model = cifar_resnet18(width=4)
    stages = CheckpointRungs(checkpoint_units(model))
    found = []
    for batch in (8, 32):
        with stages.profile(exclude=model.parameters(), checkpointed=True, record=2) as profile:
            model(torch.rand(batch, 3, 32, 32))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        checkpointed = stages.checkpointed()
        torch.manual_seed(5)
        found.append(sampled_savings(stages, profile))
        after_rng = torch.rand(1)
        torch.manual_seed(5)
        assert torch.equal(after_rng, torch.rand(1))  # the random stream was not drawn from
        assert stages.checkpointed() == checkpointed  # every unit still checkpointed
        for key, value in model.state_dict().items():  # BatchNorm statistics kept
            assert torch.equal(value, before[key]), key
    small, large = found
    assert small is not None and large is not None
    for a, b in zip(small, large, strict=True):
        assert b == pytest.approx(4 * a, rel=0.02)  # all but the per-call bytes grow with the batch


def test_sampled_savings_are_unknown_without_samples_or_for_a_unit_that_fails_on_them() -> None:
    model = cifar_resnet18(width=4)
    stages = CheckpointRungs(checkpoint_units(model))
    with stages.profile(exclude=model.parameters(), checkpointed=True) as profile:  # nothing recorded
        model(torch.rand(4, 3, 32, 32))
    assert sampled_savings(stages, profile) is None
    with stages.profile(exclude=model.parameters(), checkpointed=True, record=2) as profile:
        model(torch.rand(4, 3, 32, 32))
    name = next(iter(profile.inputs))
    profile.inputs[name] = (torch.rand(2, 1, 3, 3),)  # wrong channels: the unit raises on it
    assert sampled_savings(stages, profile) is None
