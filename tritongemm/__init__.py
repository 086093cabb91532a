"""tritongemm: GEMM kernels in Triton and Gluon, from a naive tiled kernel to Hopper TMA/WGMMA
pipelines, all behind one API.

    >>> import torch, tritongemm
    >>> a = torch.randn(1000, 3000, device="cuda", dtype=torch.bfloat16)
    >>> b = torch.randn(3000, 500, device="cuda", dtype=torch.bfloat16)
    >>> c = tritongemm.matmul(a, b)                     # the fastest kernel for this GPU
    >>> c = tritongemm.matmul(a, b, kernel="grouped")   # one rung of the ladder
"""

from tritongemm import ops  # noqa: F401  registers torch.ops.tritongemm.*
from tritongemm.api import kernels, matmul
from tritongemm.config import MatmulConfig
from tritongemm.plan import PLANS as plans

__all__ = ["matmul", "kernels", "MatmulConfig", "plans"]
__version__ = "0.1.0"
