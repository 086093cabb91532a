"""The tile orders in `triton.language`: the `@triton.jit` twins of this package's Python ones
(__init__.py), which the `tl` rungs (ladder/) and fp8's and grouped_mm's `tl` kernels number their
tiles by. tests/test_tile_order.py runs the kernels with TRACE=True and compares what they record
with the Python twin."""

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """Tile (pid_m, pid_n) of program `pid` in the grouped (swizzled) order (`tiling.grouped_tile`)."""
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n
