import math

import pytest
import torch

F64 = torch.float64


def orders(errors, resolutions):
    """Observed convergence orders log(e_i / e_{i+1}) / log(n_{i+1} / n_i)."""
    return [math.log(e0 / e1) / math.log(n1 / n0)
            for e0, e1, n0, n1 in zip(errors, errors[1:], resolutions, resolutions[1:])]


def rms(a, b):
    return float((a - b).pow(2).mean().sqrt())


devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=devices)
def device(request):
    return request.param
