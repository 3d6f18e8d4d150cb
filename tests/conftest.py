"""Test tiers. CPU: kernels run under the Triton interpreter (set before triton is imported).
GPU (marker ``gpu``): fails, never skips, when no GPU is present."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_real_empty, _real_empty_like = torch.empty, torch.empty_like


def _poison(t):
    """Fill with NaN (or -1 for integers) so that an output nobody wrote cannot pass."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype != torch.bool and t.numel():
        t.fill_(-1)
    return t


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    monkeypatch.setattr(torch, "empty", lambda *a, **k: _poison(_real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: _poison(_real_empty_like(*a, **k)))
    yield


@pytest.fixture
def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def gpu():
    if not torch.cuda.is_available():
        pytest.fail("GPU test selected but no CUDA GPU is present")
    return torch.device("cuda")
