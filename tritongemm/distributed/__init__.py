"""Tensor parallelism over torch.distributed: GEMMs whose collective runs under the GEMM
(`all_gather_matmul`, `matmul_reduce_scatter`; overlapped.py), the column- and row-parallel layers
built on them, and `parallelize` for a transformers model's projections (layers.py).
docs/tensor-parallel.md has the picture."""

from tritongemm.distributed.layers import ColumnParallelLinear, RowParallelLinear, parallelize
from tritongemm.distributed.overlapped import all_gather_matmul, matmul_reduce_scatter

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "all_gather_matmul", "matmul_reduce_scatter", "parallelize"]
