"""The demo (README command 1) runs end to end on tiny settings."""

import pytest
import torch

from lightning_bandlimit.demo import gratings, main


def test_gratings_are_deterministic_in_range_and_balanced() -> None:
    x1, y1 = gratings(40, seed=3)
    x2, y2 = gratings(40, seed=3)
    x3, _ = gratings(40, seed=4)
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and not torch.equal(x1, x3)
    assert x1.min() >= 0 and x1.max() <= 1
    assert torch.bincount(y1).tolist() == [4] * 10


def test_main_prints_a_side_by_side_table(capsys: pytest.CaptureFixture[str]) -> None:
    results = main(compressions=[0.0, 0.5], steps=3, batch_size=8, train_size=40, val_size=20)
    assert [r.compression for r in results] == [0.0, 0.5]
    assert results[0].achieved_compression == 0.0 and 0.4 < results[1].achieved_compression < 0.6
    assert results[1].saved_activation_mib < results[0].saved_activation_mib
    assert 0 < results[1].saved_by_convs_mib < 0.7 * results[0].saved_by_convs_mib
    assert all(0.0 <= r.val_accuracy <= 1.0 and r.step_ms > 0 for r in results)
    out = capsys.readouterr().out
    assert "val acc" in out and "saved act. MiB" in out


def test_main_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        main(steps=0)
