"""What refuses a checkpoint on resume, without launching: each decision ``ElasticDDPStrategy``
makes before any step (``test_elastic_ddp.py`` launches one refusal end to end, nothing written).

The messages are matched on the fact that decides (the setting that differs, the checkpoint's
path), not on their wording.
"""

from typing import Any

import pytest
import torch

from lightning_bandlimit.strategies import (
    ElasticSampler,
    ExactGlobalBatch,
    LinearScaling,
    SquareRootScaling,
    TrainingConfig,
)
from lightning_bandlimit.strategies.elastic_data import restore_position
from lightning_bandlimit.strategies.elastic_resume import (
    CheckedResume,
    check_optimizer_states,
    check_resumable,
    check_same_checkpoint,
)

PATH = "ckpt/last.ckpt"
SGD = TrainingConfig(world_size=1, per_device_batch=8, lr=0.1, momentum=0.9)
ADAM = TrainingConfig(world_size=1, per_device_batch=8, lr=0.01, betas=(0.9, 0.999), eps=1e-8)


def _sgd() -> torch.optim.Optimizer:
    return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1, momentum=0.9)


def _adam() -> torch.optim.Optimizer:
    return torch.optim.Adam(torch.nn.Linear(2, 1).parameters(), lr=0.01)


def test_a_compatible_launch_at_another_size_resumes() -> None:
    launched = TrainingConfig(world_size=2, per_device_batch=8, lr=0.1, momentum=0.9)
    check_resumable(SGD, launched, LinearScaling(), world_size=2, path=PATH)


def test_another_per_device_batch_is_refused_unless_the_rule_chooses_it() -> None:
    launched = TrainingConfig(world_size=2, per_device_batch=4, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="per-device batch") as refused:
        check_resumable(SGD, launched, LinearScaling(), world_size=2, path=PATH)
    assert PATH in str(refused.value) and "8" in str(refused.value) and "4" in str(refused.value)
    # ExactGlobalBatch chooses the micro-batch per world size: a changed one is its plan
    check_resumable(SGD, launched, ExactGlobalBatch(16, micro_batches=[4, 8]), world_size=2, path=PATH)


@pytest.mark.parametrize(("reference", "launched"), [(SGD, ADAM), (ADAM, SGD)])
def test_another_optimizer_family_is_refused(reference: TrainingConfig, launched: TrainingConfig) -> None:
    with pytest.raises(ValueError, match="Adam-family") as refused:
        check_resumable(reference, launched, LinearScaling(), world_size=1, path=PATH)
    assert PATH in str(refused.value)


def test_a_rule_that_cannot_apply_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="SquareRootScaling") as refused:
        check_resumable(SGD, SGD, SquareRootScaling(), world_size=2, path=PATH)
    assert PATH in str(refused.value) and "betas" in str(refused.value)


def test_a_saved_optimizer_state_of_another_family_is_refused() -> None:
    saved = [_adam().state_dict()]
    with pytest.raises(ValueError, match="Adam-family") as refused:
        check_optimizer_states([_sgd()], saved, PATH)
    assert PATH in str(refused.value)
    check_optimizer_states([_adam()], saved, PATH)  # the same family: torch loads it


@pytest.mark.parametrize(("field", "other"), [("dataset_size", 80), ("shuffle", False), ("seed", 1)])
def test_a_data_position_in_another_training_set_is_refused(field: str, other: Any) -> None:
    saved = ElasticSampler(96, batch_size=8, num_replicas=1, rank=0, shuffle=True, seed=0)
    saved.advance(3)
    settings: dict[str, Any] = {"dataset_size": 96, "shuffle": True, "seed": 0, field: other}
    sampler = ElasticSampler(
        settings["dataset_size"],
        8,
        num_replicas=2,
        rank=0,
        shuffle=settings["shuffle"],
        seed=settings["seed"],
    )
    with pytest.raises(ValueError, match=field) as refused:
        restore_position(sampler, saved.state_dict(), PATH)
    assert PATH in str(refused.value)


def test_the_same_data_position_resumes_at_another_size() -> None:
    saved = ElasticSampler(96, batch_size=8, num_replicas=1, rank=0, shuffle=True, seed=0)
    saved.advance(3)
    sampler = ElasticSampler(96, batch_size=8, num_replicas=2, rank=1, shuffle=True, seed=0)
    restore_position(sampler, saved.state_dict(), PATH)
    assert sampler.consumed == saved.consumed == 24
    restore_position(sampler, None, PATH)  # no checkpoint: nothing to restore


def test_ranks_that_resumed_different_checkpoints_are_refused() -> None:
    check_same_checkpoint([[4, 32], [4, 32]], PATH)
    with pytest.raises(RuntimeError, match=r"\[\[4, 32\], \[2, 16\]\]") as refused:
        check_same_checkpoint([[4, 32], [2, 16]], PATH)
    assert PATH in str(refused.value)


class _Loads:
    """Stands in for the Lightning strategy below ``CheckedResume``: loading fails as torch would."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.optimizers = [_sgd()]

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        if self.error is not None:
            raise self.error

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        if self.error is not None:
            raise self.error


class _Checked(CheckedResume, _Loads):
    _restored_path = PATH


def test_a_different_model_is_refused_naming_the_checkpoint() -> None:
    with pytest.raises(RuntimeError, match="different model") as refused:
        _Checked(RuntimeError("size mismatch for net.0.weight")).load_model_state_dict({})
    assert PATH in str(refused.value) and "net.0.weight" in str(refused.value)
    _Checked().load_model_state_dict({})


def test_an_optimizer_state_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="Adam-family"):  # said before torch's bare KeyError
        _Checked().load_optimizer_state_dict({"optimizer_states": [_adam().state_dict()]})
    with pytest.raises(ValueError, match="KeyError") as refused:
        _Checked(KeyError("momentum_buffer")).load_optimizer_state_dict({"optimizer_states": []})
    assert PATH in str(refused.value)
    _Checked().load_optimizer_state_dict({"optimizer_states": [_sgd().state_dict()]})
