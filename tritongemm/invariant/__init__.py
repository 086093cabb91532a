"""Batch invariance: a row's result the same bits whatever else is in the batch.

`matmul`, `linear` and `nn.Linear` take `batch_invariant=True` (the plans: dispatch/invariant.py);
`batch_invariant()` (torch_ops.py) routes torch's own products and row reductions through such
kernels while it is open; rowwise.py holds the reductions. docs/batch-invariance.md says what it
guarantees, how, and what it costs.
"""

from tritongemm.invariant.torch_ops import batch_invariant, is_open

__all__ = ["batch_invariant", "is_open"]
