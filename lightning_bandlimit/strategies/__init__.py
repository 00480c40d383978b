"""Building blocks for elastic training (the ``ElasticDDPStrategy`` that wires them into
Lightning is not written yet): scaling rules for a changed world size, an exactly-once elastic
sampler, and an LR schedule driven by samples seen."""

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
    "rescale_base_lrs",
]
