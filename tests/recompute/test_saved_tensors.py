"""SavedTensorMeter counts unique storages saved for backward."""

import torch
from torch import nn

from lightning_bandlimit import BandLimitedConv2d
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter


def test_shared_storages_count_once_and_parameters_can_be_excluded() -> None:
    conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    with SavedTensorMeter() as everything:
        y = torch.relu(x)
        conv(y)  # saves y (same storage as relu's output) and the weight
    with SavedTensorMeter(exclude=conv.parameters()) as activations:
        y = torch.relu(x)
        conv(y)
    act_bytes = y.nelement() * y.element_size()
    assert activations.bytes == act_bytes and activations.count == 1
    assert everything.bytes == act_bytes + conv.weight.nelement() * conv.weight.element_size()


def test_band_limited_layer_saves_less_with_compression() -> None:
    layer = BandLimitedConv2d(8, 8, 3, padding=1)
    x = torch.randn(4, 8, 32, 32, requires_grad=True)
    saved = []
    for c in (0.0, 0.5, 0.9):
        layer.compression = c
        with SavedTensorMeter(exclude=layer.parameters()) as meter:
            layer(x)
        saved.append(meter.bytes)
    assert saved[0] > saved[1] > saved[2]
    assert saved[2] < 0.2 * x.nelement() * x.element_size()


def test_a_forward_whose_backward_never_runs_leaves_nothing_alive() -> None:
    """A metered forward that raised or whose step was skipped: its graph and the model go with
    their last reference (a saved tensor kept with its graph would hold them in a cycle through
    autograd's nodes, which the garbage collector cannot see)."""
    import gc
    import weakref

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Sigmoid())
    alive = weakref.ref(model[2].weight)
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        model(torch.rand(2, 3, 16, 16)).sum()  # no backward
    assert meter.bytes > 0
    del model
    gc.collect()
    assert alive() is None


def test_gradients_through_the_meter_equal_the_plain_ones() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Sigmoid()).double()
    x = torch.rand(2, 3, 16, 16, dtype=torch.float64, requires_grad=True)
    plain = torch.autograd.grad(model(x).sum(), [x, *model.parameters()])
    with SavedTensorMeter():
        out = model(x).sum()
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(out, [x, *model.parameters()]), plain))
