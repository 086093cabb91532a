"""tritongemm as PyTorch operators: `torch.ops.tritongemm.mm`, registered with `torch.library`.

What `torch.compile` needs to put a tritongemm GEMM into a graph: an operator with a schema, a
fake implementation that gives the output's shape, strides and dtype without running anything
(Dynamo and AOTAutograd trace with it, symbolic shapes included), and autograd registered on
the operator, so that the backward is traced too. `tritongemm.matmul` calls the operator only
while compiling: in eager mode the dispatcher would add about 11 us to every call (H100 machine,
torch 2.11), so eager calls take the direct path, which is the operator's implementation anyway.
"""

from __future__ import annotations

import torch

from tritongemm import api, checks, registry
from tritongemm.config import MatmulConfig

# ----------------------------------------------------------------------------------------------
# The operator
# ----------------------------------------------------------------------------------------------


# The kernel's argument is `kernel_name`: Inductor passes an operator's arguments by name to a
# function whose first parameter is `kernel`, and a `kernel` argument collides with it.
@torch.library.custom_op("tritongemm::mm", mutates_args=())
def mm(a: torch.Tensor, b: torch.Tensor, kernel_name: str = "auto", config: str | None = None) -> torch.Tensor:
    """a (..., M, K) @ b (K, N) -> (..., M, N) by a tritongemm kernel. `config`: None, "autotune"
    or a `MatmulConfig.short()` label (an operator takes strings, not Python objects)."""
    with torch.no_grad():  # the operator's own autograd (below) differentiates it
        return api.matmul(a, b, kernel=kernel_name, config=_config(config))


@mm.register_fake
def _mm_fake(a, b, kernel_name="auto", config=None):
    checks.check_operands(a, b)
    if kernel_name != "auto":
        registry.get(kernel_name)  # an unknown name fails while tracing, not when the graph runs
    _config(config)
    return a.new_empty((*a.shape[:-1], b.shape[1]))  # contiguous, as the real one returns


def _config(label: str | None) -> MatmulConfig | str | None:
    return MatmulConfig.parse(label) if label is not None and label != "autotune" else label


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


def _setup_context(ctx, inputs, output):
    a, b, kernel, _ = inputs
    ctx.save_for_backward(a, b)
    ctx.kernel = kernel


def _backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    # The forward's config fits (M, N, K); the backward GEMMs have other shapes.
    grad_a, grad_b = api.gemm_grads(grad_c, a, b, ctx.needs_input_grad[:2], lambda x, y: mm(x, y, ctx.kernel))
    return grad_a, grad_b, None, None


mm.register_autograd(_backward, setup_context=_setup_context)

# ----------------------------------------------------------------------------------------------
# The traced call
# ----------------------------------------------------------------------------------------------


def traced_matmul(a, b, out, kernel, config) -> torch.Tensor:
    """`tritongemm.matmul` while torch.compile traces it: the operator, then out= as a copy. out's
    shape, dtype, device and autograd are checked as in eager mode; what eager mode also refuses
    (a negated or self-overlapping out, one aliasing the inputs) `copy_` handles as torch does."""
    label = config.short() if isinstance(config, MatmulConfig) else config
    if out is not None:
        checks.check_operands(a, b)
        checks.check_out_metadata(out, a, (*a.shape[:-1], b.shape[1]))
        checks.check_out_grad(out, a, b)
    result = mm(a, b, kernel, label)
    if out is None:
        return result
    return out.copy_(result)
