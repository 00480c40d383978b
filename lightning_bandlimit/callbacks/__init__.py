"""Lightning callbacks."""

from lightning_bandlimit.callbacks.adaptive_band_limit import AdaptiveBandLimit
from lightning_bandlimit.callbacks.band_limit import BandLimit
from lightning_bandlimit.callbacks.elastic_checkpoint import ElasticCheckpoint
from lightning_bandlimit.callbacks.shared_budget import SharedBudget
from lightning_bandlimit.callbacks.shared_device import SharedDevice
from lightning_bandlimit.callbacks.step_timer import StepTimer

__all__ = ["AdaptiveBandLimit", "BandLimit", "ElasticCheckpoint", "SharedBudget", "SharedDevice", "StepTimer"]
