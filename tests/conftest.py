"""Test set-up. Without a GPU the `triton.language` kernels run under the Triton interpreter,
which Triton enables when a kernel is decorated: so TRITON_INTERPRET must be set here, before
any test module imports tritongemm."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the H100 through the device tool)")
    config.addinivalue_line("markers", "slow: large shapes; part of the GPU run")


@pytest.fixture(autouse=True)
def _default_tf32():
    """Tests that flip torch's TF32 switch must not leak it into other tests."""
    saved = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved
