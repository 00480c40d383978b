"""Shared test settings and fixtures: deterministic, small, CPU-friendly.

Helpers that the scripts started in subprocesses need too live in ``_helpers.py`` (no pytest).
"""

from collections.abc import Callable, Iterator

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


@pytest.fixture
def error_line(capsys: pytest.CaptureFixture[str]) -> Callable[[], str]:
    """Reads what was printed to stderr so far: no traceback in it; returns its last non-blank line."""

    def read() -> str:
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return [line for line in err.splitlines() if line.strip()][-1]

    return read


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread for the test: tiny convolutions run far slower on two threads than on
    one when another process holds a core, and nothing compared depends on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
