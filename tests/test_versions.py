"""The torch and Triton releases tritongemm takes, refused with the range when outside it."""

import subprocess
import sys

import pytest

from tritongemm.core import versions


@pytest.mark.parametrize(
    "torch_version, triton_version", [("2.10.0", "3.6.0"), ("2.13.0+cpu", "3.7.1"), ("2.15.0", "3.9.0")]
)
def test_supported_releases_pass(torch_version, triton_version):
    versions.check(torch_version, triton_version)


@pytest.mark.parametrize(
    "torch_version, triton_version, pattern",
    [
        ("2.13.0", "3.10.0", r"supports triton 3.6 to 3.9, but triton 3.10.0 is installed"),
        ("2.9.1", "3.5.1", r"supports triton 3.6 to 3.9, but triton 3.5.1 is installed"),
        ("2.9.1", "3.6.0", r"needs torch >= 2.10, but torch 2.9.1 is installed"),
    ],
)
def test_unsupported_releases_are_refused(torch_version, triton_version, pattern):
    with pytest.raises(ImportError, match=pattern):
        versions.check(torch_version, triton_version)


def test_import_leaves_triton_unimported():
    """Triton reads TRITON_INTERPRET when a kernel is decorated; importing tritongemm must not
    import the kernels (or triton) before a program has had the chance to set it."""
    code = "import sys, tritongemm; assert 'triton' not in sys.modules, 'triton imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
