"""The ``device`` the machines and the vector replays run on: the CPU, and
CUDA where one is present (marked ``cuda``)."""

import pytest
import torch

CUDA = pytest.param(
    "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
)


@pytest.fixture(params=["cpu", CUDA])
def device(request):
    return request.param
