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
