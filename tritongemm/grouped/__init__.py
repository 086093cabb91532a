"""Grouped GEMMs for mixture-of-experts: `grouped_mm` over ragged groups and `bmm` (api.py), the
`triton.language` kernels that read the group boundaries on the device (tl.py)."""

from tritongemm.grouped.api import bmm, grouped_mm, reference_grouped_mm

__all__ = ["bmm", "grouped_mm", "reference_grouped_mm"]
