"""Elastic training: ``ElasticDDPStrategy`` (importing this package registers it as
``"elastic_ddp"``) and its parts: scaling rules for a changed world size, an exactly-once elastic
sampler, an LR schedule driven by samples seen, and the stability guard. Checkpointing for
torchrun restarts: :class:`lightning_bandlimit.callbacks.ElasticCheckpoint`."""

from lightning_bandlimit.strategies.adascale import AdaScale, adascale_gain, gradient_noise_statistics
from lightning_bandlimit.strategies.elastic_ddp import ElasticDDPStrategy, register_elastic_strategies
from lightning_bandlimit.strategies.elastic_sampler import ElasticSampler
from lightning_bandlimit.strategies.exact_global_batch import ExactGlobalBatch
from lightning_bandlimit.strategies.optimizer_config import apply_to_optimizer, read_optimizer
from lightning_bandlimit.strategies.registry import rule_from_name, rule_names
from lightning_bandlimit.strategies.rules import (
    KeepGlobalBatch,
    LinearScaling,
    MomentumAwareScaling,
    NoScaling,
    SquareRootScaling,
    default_rule,
)
from lightning_bandlimit.strategies.scaling_rule import MicroBatchPlan, ScalingRule, TrainingConfig
from lightning_bandlimit.strategies.schedules import SampleSchedule, lr_multiplier, rescale_base_lrs
from lightning_bandlimit.strategies.stability import StabilityGuard

__all__ = [
    "AdaScale",
    "ElasticDDPStrategy",
    "ElasticSampler",
    "ExactGlobalBatch",
    "KeepGlobalBatch",
    "LinearScaling",
    "MicroBatchPlan",
    "MomentumAwareScaling",
    "NoScaling",
    "SampleSchedule",
    "ScalingRule",
    "SquareRootScaling",
    "StabilityGuard",
    "TrainingConfig",
    "adascale_gain",
    "apply_to_optimizer",
    "default_rule",
    "gradient_noise_statistics",
    "lr_multiplier",
    "read_optimizer",
    "register_elastic_strategies",
    "rescale_base_lrs",
    "rule_from_name",
    "rule_names",
]
