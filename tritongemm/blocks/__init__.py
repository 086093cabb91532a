"""Fused transformer blocks: several of a block's GEMMs and the elementwise work between them in
fewer kernels (gated_mlp.py, qkv.py), the RMSNorms before them in one kernel each (rms_norm.py),
and `fuse_mlps`, `fuse_qkv` and `fuse_norms`, which put them in a transformers model's place.
(residual.py, the decoder layers' residual adds, imports tritongemm.nn and so is imported where it
is used.)"""

from tritongemm.blocks.fuse import fuse_mlps, fuse_norms, fuse_qkv
from tritongemm.blocks.gated_mlp import GatedMLP
from tritongemm.blocks.qkv import QKVProjection
from tritongemm.blocks.rms_norm import RMSNorm

__all__ = ["GatedMLP", "QKVProjection", "RMSNorm", "fuse_mlps", "fuse_norms", "fuse_qkv"]
