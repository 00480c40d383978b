"""The strategy's peer health on models users bring: a torchvision and a timm model in
channels_last with ``bf16-mixed``, two processes. The watchdog runs, every rank's forward is
timed and gathered, a rank made slow is reported by every rank, and training is unchanged by it
(the ranks hold the same weights, the loss is finite)."""

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
@pytest.mark.parametrize("extra_sleep", [0.0, 1.0], ids=["even", "rank 1 slow"])
def test_peer_health_on_a_zoo_model_in_channels_last_and_bf16(
    tmp_path: Path, model: str, extra_sleep: float
) -> None:
    run_python(str(SCRIPT), model, str(extra_sleep), cwd=tmp_path, BANDLIMIT_OUT=str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in ranks:
        assert report["watchdog"], report
        assert report["precision"] == "bf16-mixed" and report["channels_last"], report
        assert all(math.isfinite(loss) for loss in report["losses"]), report
        # every optimizer step after the first: both ranks' forward times, gathered
        assert len(report["window"]) == 3 and all(len(t) == 2 and min(t) > 0 for t in report["window"])
        if extra_sleep:
            assert all(t[1] > 2 * t[0] for t in report["window"]), report["window"]
        assert report["stragglers"] == ([1] if extra_sleep else []), report
    assert ranks[0]["window"] == ranks[1]["window"]  # the same figures, so the same verdict
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
