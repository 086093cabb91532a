"""tritongemm: GEMM kernels in Triton and Gluon, from a naive tiled kernel to Hopper TMA/WGMMA
pipelines, all behind one API.

    >>> import torch, tritongemm
    >>> a = torch.randn(1000, 3000, device="cuda", dtype=torch.bfloat16)
    >>> b = torch.randn(3000, 500, device="cuda", dtype=torch.bfloat16)
    >>> c = tritongemm.matmul(a, b)                     # the fastest kernel for this GPU
    >>> c = tritongemm.matmul(a, b, kernel="grouped")   # one rung of the ladder
    >>> w = torch.randn(500, 3000, device="cuda", dtype=torch.bfloat16)  # an nn.Linear weight
    >>> y = tritongemm.linear(a, w, activation="gelu")  # F.gelu(F.linear(a, w)), one kernel
"""

from tritongemm.core import versions

versions.check()

# Each family defines its torch.ops.tritongemm operators in the module of its public function;
# inductor.py imports every one of those modules and hooks its lowerings onto their first trace.
from tritongemm import distributed, inductor, nn  # noqa: E402, F401
from tritongemm.core.config import MatmulConfig  # noqa: E402
from tritongemm.core.plans import PLANS as plans  # noqa: E402
from tritongemm.core.registry import kernels  # noqa: E402
from tritongemm.dense.linear import linear  # noqa: E402
from tritongemm.dense.matmul import matmul  # noqa: E402
from tritongemm.fp8 import quantize_fp8, scaled_mm  # noqa: E402
from tritongemm.grouped import bmm, grouped_mm  # noqa: E402
from tritongemm.invariant import batch_invariant  # noqa: E402
from tritongemm.patching.patch import patch  # noqa: E402

__all__ = ["matmul", "linear", "scaled_mm", "quantize_fp8", "grouped_mm", "bmm", "batch_invariant", "nn", "patch",
           "kernels", "MatmulConfig", "plans"]  # fmt: skip
__version__ = "0.1.0"
