"""``torch.compile`` of band-limited models: same results as eager, no graph breaks, few recompiles."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
from torch import nn

from lightning_bandlimit import bandlimit
from lightning_bandlimit.functional import compile as compile_module
from lightning_bandlimit.layers.band_limited import BandLimitedConv1d, BandLimitedConv2d


class _Block(nn.Module):
    """conv-bn-relu-pool, a residual pair of 3x3 convs and a strided 1x1 shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.down = nn.Conv2d(8, 16, 1, stride=2)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.bn0(self.stem(x))))
        y = self.conv2(self.relu(self.bn1(self.conv1(x))))
        x = self.relu(x + y)
        return self.head(self.down(x).mean((2, 3)))


def _models(compression: float, memory_lean: bool) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = bandlimit(_Block().double(), compression, memory_lean=memory_lean)
    return model, copy.deepcopy(model)


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    out = model(x)
    out.square().sum().backward()
    grads = [p.grad for p in model.parameters()]
    return out, [x.grad, *grads]


@pytest.fixture(autouse=True)
def _reset() -> None:
    torch._dynamo.reset()
    compile_module._WARNED.clear()


@pytest.mark.parametrize("compression", [0.0, 0.5])
@pytest.mark.parametrize("memory_lean", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_compiled_equals_eager(compression: float, memory_lean: bool, training: bool) -> None:
    model, reference = _models(compression, memory_lean)
    model.train(training)
    reference.train(training)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # fullgraph: no graph break
    x = torch.randn(2, 3, 20, 20, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # twice: the second call runs the cached graph
            out, grads = _step(compiled, x)
            expected, expected_grads = _step(reference, x)
            torch.testing.assert_close(out, expected)
            for grad, expected_grad in zip(grads, expected_grads):
                torch.testing.assert_close(grad, expected_grad)
    torch.testing.assert_close(model.state_dict(), reference.state_dict())  # BatchNorm statistics
    assert model.stem.achieved_compression == pytest.approx(reference.stem.achieved_compression)


def test_memory_lean_warns_once() -> None:
    model, _ = _models(0.5, True)
    compiled = torch.compile(model, backend="aot_eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            compiled(torch.randn(2, 3, 16, 16, dtype=torch.float64)).sum().backward()
    lean = [w for w in caught if "memory-lean" in str(w.message)]
    assert len(lean) == 1


def test_no_warning_without_memory_lean() -> None:
    model, _ = _models(0.5, False)
    compiled = torch.compile(model, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(torch.randn(2, 3, 16, 16, dtype=torch.float64)).sum().backward()


def test_compression_changes_cost_at_most_one_recompile() -> None:
    model, _ = _models(0.0, False)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    for compression in (0.0, 0.5, 0.7, 0.5, 0.0):
        for layer in model.modules():
            if isinstance(layer, BandLimitedConv2d):
                layer.compression = compression
        compiled(x).sum().backward()
    assert counter.frame_count <= 3
    compiles = counter.frame_count
    # A schedule of many distinct levels (a ramp, AdaptiveBandLimit) reuses one graph above 0.
    for compression in torch.linspace(0.05, 0.9, 12).tolist():
        for layer in model.modules():
            if isinstance(layer, BandLimitedConv2d):
                layer.compression = compression
        compiled(x).sum().backward()
    assert counter.frame_count == compiles  # far from the default recompile limit (8)


@pytest.mark.parametrize("algorithm", ["spectral", "spatial"])
@pytest.mark.parametrize("padding_mode", ["zeros", "reflect"])
def test_compiled_conv1d_and_options(algorithm: str, padding_mode: str) -> None:
    torch.manual_seed(0)
    layer = BandLimitedConv1d(
        3, 5, 5, padding=2, padding_mode=padding_mode, compression=0.6, memory_lean=False
    ).double()
    layer.algorithm = algorithm
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    for x in (torch.randn(2, 3, 40, dtype=torch.float64), torch.randn(3, 40, dtype=torch.float64)):
        out, grads = _step(compiled, x)
        expected, expected_grads = _step(layer, x)
        torch.testing.assert_close(out, expected)
        for grad, expected_grad in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected_grad)


def test_compiled_autocast() -> None:
    torch.manual_seed(0)
    layer = BandLimitedConv2d(3, 4, 3, padding=1, compression=0.5, memory_lean=False)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 3, 12, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = compiled(x), layer(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    # bfloat16 round-off: the compiled op runs the spatial algorithm's convolution in float32
    torch.testing.assert_close(out, expected, atol=1e-2, rtol=2e-2)


def test_inductor() -> None:
    torch.manual_seed(0)
    model = bandlimit(
        nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3), nn.ReLU()), 0.5
    )
    reference = copy.deepcopy(model)
    compiled = torch.compile(model)
    x = torch.randn(2, 2, 10, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, grads = _step(compiled, x)
    expected, expected_grads = _step(reference, x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
