"""Shared test settings: deterministic, small, CPU-friendly."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
