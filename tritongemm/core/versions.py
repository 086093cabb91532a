"""Which torch and Triton tritongemm runs with, checked when it is imported.

Each torch pins one Triton (2.10 and 2.11: 3.6; 2.12: 3.7.0; 2.13: 3.7.1; 2.14: 3.8; triton 3.9 is
the newest release). The Gluon kernels use an API that moves between Triton releases: the
differences tritongemm knows live in primitives/gluon/compat.py, and a release past them is refused
here rather than failing inside a kernel's compilation. pyproject.toml declares the same bounds.
"""

from importlib import metadata

import torch

TORCH_MIN = (2, 10)  # the oldest torch whose Triton (3.6) the Gluon kernels compile with
TRITON_RANGE = ((3, 6), (3, 9))  # oldest and newest minor release checked (README: "Versions")


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check(torch_version: str = torch.__version__, triton_version: str | None = None) -> None:
    """Raise ImportError naming the version found and the range supported. Triton's version is
    read from its package metadata: importing triton here would fix its interpreter switch
    (TRITON_INTERPRET) before a program that imports tritongemm first has set it."""
    triton_version = triton_version or metadata.version("triton")
    oldest, newest = TRITON_RANGE
    if not oldest <= _minor(triton_version) <= newest:
        raise ImportError(
            f"tritongemm supports triton {oldest[0]}.{oldest[1]} to {newest[0]}.{newest[1]}, but triton "
            f"{triton_version} is installed; install a torch that pins one of those (torch >= 2.10), "
            f"or e.g. pip install 'triton>={oldest[0]}.{oldest[1]},<{newest[0]}.{newest[1] + 1}'"
        )
    if _minor(torch_version) < TORCH_MIN:
        raise ImportError(
            f"tritongemm needs torch >= {TORCH_MIN[0]}.{TORCH_MIN[1]}, but torch {torch_version} is installed"
        )
