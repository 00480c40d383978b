"""The model-zoo conformance suite: every zoo model (``zoo/models.py``) through every lever
(``zoo/cells.py``): band-limiting at c=0 is exact, at c=0.5 trains, every checkpointing rung is
exact and the top one keeps less, ``AdaptiveBandLimit`` walks the whole ladder in a ``Trainer``,
bfloat16 autocast, channels-last and ``torch.compile``.

Known failures are listed in :data:`KNOWN` (strict ``xfail``: a fix makes them pass loudly).
Run alone with ``pytest -m zoo``; ``benchmarks/zoo_matrix.py`` prints the same cells as a matrix.
"""

from __future__ import annotations

import pytest
from zoo.cells import CELL_FUNCTIONS, cells_for
from zoo.models import MODELS

pytestmark = pytest.mark.zoo

_BF16_OUT = (
    "bf16 autocast backward through the spectral kernel: RuntimeError: Expected out tensor to have "
    "dtype float, but got c10::BFloat16 instead, at lightning_bandlimit/functional/dft_plan.py:253 "
    "(torch.bmm(..., out=rows) in _spectrum_to_maps) <- dft_plan.py:264 (analysis_adjoint) "
    "<- spectral_kernel.py:387 (backward)"
)
_BF16_MIX = (
    "bf16 autocast backward through the spectral kernel: RuntimeError: expected scalar type BFloat16 "
    "but found Float, at lightning_bandlimit/functional/spectral_kernel.py:149 (torch.bmm(..., out=out[0]) "
    "in _mix_grad_filter) <- spectral_kernel.py:280 <- spectral_kernel.py:380 (backward)"
)
#: (model, cell) -> (reason, strict): known failures of the package, with the error and its place.
KNOWN: dict[tuple[str, str], tuple[str, bool]] = {
    **{
        (name, "bf16"): (_BF16_OUT, True)
        for name in (
            "mobilenet_v2",
            "mobilenet_v3_small",
            "efficientnet_b0",
            "mnasnet0_5",
            "shufflenet_v2_x0_5",
            "convnext_tiny",
            "timm/convnext_atto",
            "timm/efficientnet_b0",
            "timm/mobilenetv3_small_050",
            "timm/mixnet_s",
            "timm/ghostnet_050",
        )
    },
    ("timm/dla46_c", "bf16"): (_BF16_MIX, True),
}


def _params() -> list:
    params = []
    for name, cell in cells_for(list(MODELS)):
        marks = []
        if (name, cell) in KNOWN:
            reason, strict = KNOWN[(name, cell)]
            marks.append(pytest.mark.xfail(strict=strict, reason=reason))
        params.append(pytest.param(name, cell, marks=marks, id=f"{name}-{cell}"))
    return params


@pytest.mark.parametrize(("name", "cell"), _params())
def test_zoo(name: str, cell: str) -> None:
    CELL_FUNCTIONS[cell](name)
