"""The strategy's peer health on models users bring: a torchvision and a timm model in
channels_last with ``bf16-mixed``, two processes. The watchdog runs, every rank's forward is
timed and gathered, a rank made slow is reported by every rank, and training is unchanged by it
(the ranks hold the same weights, the loss is finite). One launch per model: an even phase, then
rank 1 made slow (``zoo_health_script.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _helpers import run_python

pytestmark = pytest.mark.slow  # two processes, Lightning's launcher

SCRIPT = Path(__file__).with_name("zoo_health_script.py")
MODELS = ["torchvision:resnet18", "timm:efficientnet_b0"]


@pytest.mark.parametrize("model", MODELS)
def test_peer_health_on_a_zoo_model_in_channels_last_and_bf16(tmp_path: Path, model: str) -> None:
    run_python(str(SCRIPT), model, "1.0", cwd=tmp_path, BANDLIMIT_OUT=str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for phase in ("even", "slow"):
        for report in (r[phase] for r in ranks):
            assert report["watchdog"], (phase, report)
            assert report["precision"] == "bf16-mixed" and report["channels_last"], (phase, report)
            assert all(math.isfinite(loss) for loss in report["losses"]), (phase, report)
            # every optimizer step after the first: both ranks' forward times, gathered
            window = report["window"]
            assert len(window) == 3 and all(len(t) == 2 and min(t) > 0 for t in window), (phase, report)
            if phase == "slow":
                assert all(t[1] > 2 * t[0] for t in window), window
            assert report["stragglers"] == ([1] if phase == "slow" else []), (phase, report)
        assert ranks[0][phase]["window"] == ranks[1][phase]["window"]  # the same figures, so the same verdict
        assert ranks[0][phase]["checksum"] == ranks[1][phase]["checksum"]
