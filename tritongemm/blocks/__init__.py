"""Fused transformer blocks: several of a block's GEMMs and the elementwise work between them in
fewer kernels (gated_mlp.py, qkv.py), and `fuse_mlps` and `fuse_qkv`, which put them in a
transformers model's place. (residual.py, the decoder layers' residual adds, imports tritongemm.nn
and so is imported where it is used.)"""

from tritongemm.blocks.fuse import fuse_mlps, fuse_qkv
from tritongemm.blocks.gated_mlp import GatedMLP
from tritongemm.blocks.qkv import QKVProjection

__all__ = ["GatedMLP", "QKVProjection", "fuse_mlps", "fuse_qkv"]
