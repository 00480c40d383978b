"""The model-zoo suite: torch on one thread (tiny convolutions run faster so on two shared cores),
Lightning's start-up chatter silenced."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _zoo_one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _quiet_lightning() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "lightning_bandlimit")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    yield
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)
