import pytest
import torch

F64 = torch.float64

devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=devices)
def device(request):
    return request.param
