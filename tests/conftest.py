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
    config.addinivalue_line(
        "markers",
        "large(gib): > 2**31-element tensors; runs alone among the xdist workers, skipped unless gib GiB of GPU "
        "memory are free",
    )


@pytest.fixture(autouse=True)
def _default_tf32():
    """Tests that flip torch's TF32 switch must not leak it into other tests."""
    saved = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture(autouse=True)
def _large_memory(request):
    """Tests marked large(gib=...) take a lock that one xdist worker holds at a time, so two of
    them never share the GPU's memory, and skip unless `gib` GiB are free once they have it."""
    marker = request.node.get_closest_marker("large")
    if marker is None or not torch.cuda.is_available():
        yield
        return
    import fcntl
    import gc
    import tempfile

    gib = marker.kwargs.get("gib", 10)
    with open(os.path.join(tempfile.gettempdir(), "tritongemm-large-tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info()[0] / 2**30
        if free < gib:
            pytest.skip(f"needs {gib} GiB of free GPU memory, {free:.1f} GiB free")
        yield
        gc.collect()
        torch.cuda.empty_cache()
