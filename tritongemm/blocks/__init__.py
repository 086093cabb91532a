"""Fused transformer blocks: several of a block's GEMMs and the elementwise work between them in
fewer kernels (gated_mlp.py), and `fuse_mlps`, which puts them in a transformers model's place."""

from tritongemm.blocks.fuse import fuse_mlps
from tritongemm.blocks.gated_mlp import GatedMLP

__all__ = ["GatedMLP", "fuse_mlps"]
