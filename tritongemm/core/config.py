"""Tile configurations: what one launch of a GEMM kernel is parametrized by, and the defaults.

The field names are the kernels' meta-parameter names, so a config reads the same in Python and
in the kernel source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

SCHEDULERS = ("grouped", "chunked")


@dataclass(frozen=True)
class MatmulConfig:
    BLOCK_M: int = 128  # rows of C per program (tile height)
    BLOCK_N: int = 128  # columns of C per program (tile width)
    BLOCK_K: int = 64  # depth of one tl.dot / one MMA step along K
    GROUP_SIZE_M: int = 8  # tile rows per group in the swizzled order; 1 = plain row-major
    num_warps: int = 4  # warps per program (Hopper WGMMA wants 4 or 8)
    num_stages: int = 3  # pipeline depth: Triton's num_stages, or the Gluon kernels' smem buffers
    scheduler: str = "grouped"  # persistent Gluon kernels: "grouped" (strided) or "chunked"
    split_k: int = 0  # split_k and swap_ab: programs per output tile along K; 0 = enough to fill the SMs

    def __post_init__(self) -> None:
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            value = getattr(self, name)
            if name == "BLOCK_N" and self.odd_width:  # two power-of-two parts (ladder/odd_width.py)
                continue
            if not _is_power_of_two(value) or value < 16:
                raise ValueError(
                    f"MatmulConfig: {name} must be a power of two >= 16 (tl.dot needs at least 16 "
                    f"on every axis), or BLOCK_N the sum of two (an odd width: 96, 160, 192, ...), but got "
                    f"{name}={value!r}"
                )
        if not isinstance(self.GROUP_SIZE_M, int) or self.GROUP_SIZE_M < 1:
            raise ValueError(f"MatmulConfig: GROUP_SIZE_M must be an int >= 1, but got {self.GROUP_SIZE_M!r}")
        if not _is_power_of_two(self.num_warps) or self.num_warps > 16:
            raise ValueError(f"MatmulConfig: num_warps must be 1, 2, 4, 8 or 16, but got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"MatmulConfig: num_stages must be an int >= 1, but got {self.num_stages!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"MatmulConfig: scheduler must be one of {SCHEDULERS}, but got {self.scheduler!r}")
        if not isinstance(self.split_k, int) or isinstance(self.split_k, bool) or self.split_k < 0:
            raise ValueError(f"MatmulConfig: split_k must be an int >= 0 (0: per shape), but got {self.split_k!r}")

    @property
    def odd_width(self) -> bool:
        """BLOCK_N is not a power of two but the sum of two, each >= 16 (160 = 128 + 32): a tile
        only ladder/odd_width.py computes, as two parts side by side."""
        n = self.BLOCK_N
        if not isinstance(n, int) or isinstance(n, bool) or n < 48 or _is_power_of_two(n):
            return False
        low = n & -n  # the smaller part
        return low >= 16 and _is_power_of_two(n - low)

    def meta(self) -> dict:
        """The tile meta-parameters as keyword arguments for a ``@triton.jit`` launch (per call:
        a plain dict, as `dataclasses.asdict` deep-copies every field)."""
        return dict(
            BLOCK_M=self.BLOCK_M,
            BLOCK_N=self.BLOCK_N,
            BLOCK_K=self.BLOCK_K,
            GROUP_SIZE_M=self.GROUP_SIZE_M,
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )

    def num_tiles(self, M: int, N: int) -> int:
        """Output tiles of an M x N result (partial tiles count)."""
        return -(-M // self.BLOCK_M) * -(-N // self.BLOCK_N)

    def short(self) -> str:
        """A compact label for tables, e.g. ``128x256x64 g8 w8 s3`` (`` chunked`` and `` k4`` follow
        when the scheduler and split_k are not the defaults)."""
        label = (
            f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} g{self.GROUP_SIZE_M} w{self.num_warps} s{self.num_stages}"
        )
        if self.scheduler != "grouped":
            label += f" {self.scheduler}"
        return label + (f" k{self.split_k}" if self.split_k else "")

    def with_(self, **changes) -> MatmulConfig:
        return replace(self, **changes)

    @classmethod
    def parse(cls, label: str) -> MatmulConfig:
        """The inverse of `short()`: how a config travels through a torch operator, whose
        arguments can be strings but not Python objects."""
        match = _LABEL.fullmatch(label.strip()) if isinstance(label, str) else None
        if match is None:
            raise ValueError(
                f"MatmulConfig.parse: expected a label like '128x256x64 g8 w8 s3' (MatmulConfig.short()), "
                f"but got {label!r}"
            )
        m, n, k, group, warps, stages, scheduler, split_k = match.groups()
        sizes = (int(m), int(n), int(k), int(group), int(warps), int(stages))
        return cls(*sizes, scheduler or "grouped", int(split_k or 0))


_LABEL = re.compile(r"(\d+)x(\d+)x(\d+) g(\d+) w(\d+) s(\d+)(?: (grouped|chunked))?(?: k(\d+))?")


def _is_power_of_two(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 and value & (value - 1) == 0
