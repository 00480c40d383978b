"""Shared test settings: deterministic, small, CPU-friendly."""

import lightning.pytorch as pl
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


class StopAfter(pl.Callback):
    """Interrupt a run, as a pre-emption would, after ``steps`` optimizer steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True


@pytest.fixture
def stop_after() -> type[StopAfter]:
    """The :class:`StopAfter` callback class (for resume-from-checkpoint tests)."""
    return StopAfter
