"""The Lightning-free parts of ElasticDDPStrategy: checkpoint state, resize adjustment, rule registry."""

import pytest
import torch

from lightning_bandlimit.strategies import (
    ExactGlobalBatch,
    LinearScaling,
    SampleSchedule,
    ScalingRule,
    TrainingConfig,
    rule_from_name,
    rule_names,
)
from lightning_bandlimit.strategies.elastic_resize import Rewarm, Snapshot, apply_config
from lightning_bandlimit.strategies.elastic_resume import FORMAT, ResumeState


def _state() -> ResumeState:
    config = TrainingConfig(world_size=2, per_device_batch=8, lr=0.1, betas=(0.9, 0.99), eps=1e-8)
    return ResumeState(
        config, config, world_size=2, samples_seen=32, noise={"trace": 1.0}, rewarm=Rewarm(16, 64, 0.5)
    )


def test_resume_state_round_trips_through_the_checkpoint_entry() -> None:
    saved = _state().to_checkpoint()
    assert saved["format"] == FORMAT and saved["rewarm"] == [16, 64, 0.5]
    assert ResumeState.from_checkpoint(saved, "last.ckpt") == _state()


@pytest.mark.parametrize("found", [1, 3, None])
def test_an_unknown_format_is_refused_naming_the_checkpoint(found: object) -> None:
    saved = _state().to_checkpoint()
    if found is None:
        del saved["format"]
    else:
        saved["format"] = found
    with pytest.raises(ValueError, match=r"last\.ckpt") as refused:  # names the checkpoint
        ResumeState.from_checkpoint(saved, "last.ckpt")
    assert repr(found) in str(refused.value) and str(FORMAT) in str(refused.value)


def test_apply_config_rescales_each_optimizer_once_and_every_schedule() -> None:
    p = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([{"params": [p]}, {"params": [], "lr": 0.01}], lr=0.1, momentum=0.9)
    first = SampleSchedule(optimizer, total_samples=100, kind="constant")
    second = SampleSchedule(optimizer, total_samples=100, kind="constant")
    plain = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
    old = TrainingConfig(world_size=1, per_device_batch=8, lr=0.1, momentum=0.9)
    new = LinearScaling().adjust(old, world_size=2)
    apply_config([optimizer, plain], [first, second], old, new)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.2, 0.02])
    assert first.base_lrs == pytest.approx([0.2, 0.02]) and second.base_lrs == pytest.approx([0.2, 0.02])
    assert second.get_last_lr() == pytest.approx([0.2, 0.02])
    assert plain.param_groups[0]["lr"] == pytest.approx(0.2)


def test_snapshot_restores_and_moves_the_schedule_on() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = SampleSchedule(optimizer, total_samples=100, kind="linear")
    config = TrainingConfig(world_size=1, per_device_batch=8, lr=0.1)
    snapshot = Snapshot.take(model, [optimizer], [schedule], config, accumulation=1, samples_seen=10)
    weight = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    schedule.advance(50)
    snapshot.restore(model, [optimizer], [schedule], samples_seen=30)
    assert torch.equal(model.weight, weight) and schedule.progress == 20


def _package_rules(cls: type = ScalingRule) -> set[type]:
    found = {c for c in cls.__subclasses__() if c.__module__.startswith("lightning_bandlimit.")}
    return found.union(*(_package_rules(c) for c in found))


def test_rule_registry_holds_every_rule_of_the_package_by_its_name() -> None:
    needs = {"exact-global-batch": {"global_batch": 64, "micro_batches": [32]}}  # no default global batch
    assert {rule.name for rule in _package_rules()} == set(rule_names())
    assert all(rule_from_name(name, **needs.get(name, {})).name == name for name in rule_names())
    assert isinstance(rule_from_name("exact-global-batch", **needs["exact-global-batch"]), ExactGlobalBatch)
    with pytest.raises(ValueError, match="cubic"):
        rule_from_name("cubic")
