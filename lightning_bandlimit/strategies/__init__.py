"""Elastic training: scaling rules for a changed world size, an exactly-once elastic sampler, an
LR schedule driven by samples seen, and ``ElasticDDPStrategy`` (importing this package registers
it as ``"elastic_ddp"``). So far the strategy rescales the optimizer by rule when a run resumes on
another world size; it does not yet wire in the sampler, AdaScale, the stability guard, SIGTERM
checkpoints or automatic resume."""

from lightning_bandlimit.strategies.elastic_ddp import ElasticDDPStrategy, register_elastic_strategies
from lightning_bandlimit.strategies.elastic_sampler import ElasticSampler
from lightning_bandlimit.strategies.scaling import (
    KeepGlobalBatch,
    LinearScaling,
    MomentumAwareScaling,
    ScalingRule,
    SquareRootScaling,
    TrainingConfig,
    adascale_gain,
    apply_to_optimizer,
    default_rule,
    gradient_noise_statistics,
    read_optimizer,
)
from lightning_bandlimit.strategies.schedules import SampleSchedule, lr_multiplier, rescale_base_lrs

__all__ = [
    "ElasticDDPStrategy",
    "ElasticSampler",
    "KeepGlobalBatch",
    "LinearScaling",
    "MomentumAwareScaling",
    "SampleSchedule",
    "ScalingRule",
    "SquareRootScaling",
    "TrainingConfig",
    "adascale_gain",
    "apply_to_optimizer",
    "default_rule",
    "gradient_noise_statistics",
    "lr_multiplier",
    "read_optimizer",
    "register_elastic_strategies",
    "rescale_base_lrs",
]
