"""The DFT transforms run a batch slice at a time when their intermediate would be large.

The slicing bounds a backward pass's transient memory; it must not change any result. Here the
slice size is forced down to one sample, so every transform takes the sliced path, and the
results are compared with the whole-batch path in float64.
"""

from __future__ import annotations

import pytest
import torch

from lightning_bandlimit.functional import dft_plan as dft
from lightning_bandlimit.functional import fft_conv2d
from lightning_bandlimit.functional.geometry import resolve_geometry


def _plan(x: torch.Tensor, w: torch.Tensor, stride: int, compression: float) -> dft.DFTPlan:
    geometry = resolve_geometry(x, w, None, stride, 1, 1, 1, "zeros", 2)
    return dft.dft_plan(geometry, compression, torch.float64, torch.device("cpu"))


def test_pieces_cover_the_batch_in_order() -> None:
    budget = dft._TRANSIENT_BYTES
    assert dft.batch_slices(10, 1 << 30, budget) == [slice(i, i + 1) for i in range(10)]
    assert dft.batch_slices(10, 1, budget) == [slice(0, 10)]
    pieces = dft.batch_slices(10, budget // 3, budget)
    assert pieces == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]


@pytest.mark.parametrize("stride, compression", [(1, 0.0), (1, 0.5), (2, 0.75)])
def test_sliced_transforms_equal_the_whole_batch(monkeypatch, stride: int, compression: float) -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 3, 12, 10, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    plan = _plan(x, w, stride, compression)
    spec = dft.analysis(x, plan)
    grad_out = torch.randn(5, 4, *plan.geometry.out_size, dtype=torch.float64)
    y_spec = torch.randn(2, plan.band.kept, 5, 4, dtype=torch.float64)
    whole = (
        spec,
        dft.analysis_adjoint(spec, plan),
        dft.synthesis(y_spec, plan),
        dft.synthesis_adjoint(grad_out, plan),
    )
    monkeypatch.setattr(dft, "_TRANSIENT_BYTES", 1)
    assert len(dft.batch_slices(5, 8, dft._TRANSIENT_BYTES)) == 5
    sliced = (
        dft.analysis(x, plan),
        dft.analysis_adjoint(spec, plan),
        dft.synthesis(y_spec, plan),
        dft.synthesis_adjoint(grad_out, plan),
    )
    for name, a, b in zip(("analysis", "analysis_adjoint", "synthesis", "synthesis_adjoint"), whole, sliced):
        assert a.shape == b.shape, name
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12, msg=name)


def test_a_sliced_convolution_has_the_same_gradients(monkeypatch) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 2, 9, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64, requires_grad=True)

    def run() -> list[torch.Tensor]:
        out = fft_conv2d(x, w, padding=1, compression=0.5, algorithm="spectral")
        return [out, *torch.autograd.grad((out * out).sum(), (x, w))]

    whole = run()
    monkeypatch.setattr(dft, "_TRANSIENT_BYTES", 1)
    for a, b in zip(whole, run()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)
