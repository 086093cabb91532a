"""Fused transformer blocks: several of a block's GEMMs and the elementwise work between them in
fewer kernels (gated_mlp.py with gated_pair.py, qkv.py), the RMSNorms before them in one kernel
each (rms_norm.py), the decoder layers' residual adds in their GEMMs' stores (residual.py).
`tritongemm.patch(model, fuse=True)` puts them in a transformers model's place (patching/)."""

from tritongemm.blocks.gated_mlp import GatedMLP
from tritongemm.blocks.qkv import QKVProjection
from tritongemm.blocks.rms_norm import RMSNorm

__all__ = ["GatedMLP", "QKVProjection", "RMSNorm"]
