"""tritongemm in a model: the modules, and `patch`, which puts them in place of a model's own.

    >>> import torch, tritongemm
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(4096, 14336), torch.nn.SiLU(), torch.nn.Linear(14336, 4096))
    >>> tritongemm.patch(mlp.cuda().half())   # both GEMMs by tritongemm; the SiLU stays a module
    >>> up = tritongemm.nn.Linear(4096, 14336, activation="silu", device="cuda")   # SiLU in the epilogue

Each module lives with its family (dense/module.py, fp8/linear.py and fp8/training.py, blocks/), `patch` in
patching/patch.py; this module names them together, as torch.nn does.
"""

from tritongemm.blocks.gated_mlp import GatedMLP
from tritongemm.blocks.qkv import QKVProjection
from tritongemm.blocks.rms_norm import RMSNorm
from tritongemm.dense.module import Linear
from tritongemm.fp8.linear import Fp8Linear
from tritongemm.fp8.training import Fp8TrainingConfig, Fp8TrainingLinear
from tritongemm.patching.patch import PatchReport, patch

__all__ = [
    "Linear", "Fp8Linear", "Fp8TrainingLinear", "Fp8TrainingConfig", "GatedMLP", "QKVProjection", "RMSNorm", "patch",
    "PatchReport",
]  # fmt: skip
