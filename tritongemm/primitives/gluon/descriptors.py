"""TMA descriptors for the Gluon kernels, and launches that move a plan's descriptors onto each
call's tensors. Which operands TMA takes as they are, and the aligned copies of those it does
not, are core/tma.py's (host rules, no Triton)."""

import functools
from dataclasses import dataclass

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tritongemm.core.epilogue import PLAIN, Epilogue
from tritongemm.core.tma import a_descriptor_view, b_descriptor_view, tma_strides, tma_unsupported_reason
from tritongemm.primitives.launch import compile_launch

GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
# The fp8 operands of the fp8 rungs (fp8/; fp8/tma.py, fp8_ws.py, fp8_block.py): the bf16 rungs do not take them.
FP8_GL_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}


@dataclass(frozen=True)
class Descriptors:
    a: TensorDescriptor  # (M, K) block [BLOCK_M, BLOCK_K], or (K, M) block [BLOCK_K, BLOCK_M]
    b: TensorDescriptor  # (K, N) block [BLOCK_K, BLOCK_N], or (N, K) block [BLOCK_N, BLOCK_K]
    c: TensorDescriptor  # (M, N), block [BLOCK_M, BLOCK_N // epi_split]
    a_m_major: bool
    b_k_major: bool

    def layout_constexprs(self) -> dict:
        """The kernels' constexprs for the operands' layouts."""
        return dict(A_M_MAJOR=self.a_m_major, B_K_MAJOR=self.b_k_major)


@functools.cache
def _shared_layout(block: tuple[int, int], dtype: torch.dtype, cga_layout: tuple = ()) -> gl.NVMMASharedLayout:
    more = dict(cga_layout=[list(basis) for basis in cga_layout]) if cga_layout else {}
    return gl.NVMMASharedLayout.get_default_for(list(block), (GL_DTYPES | FP8_GL_DTYPES)[dtype], **more)


def descriptor(t: torch.Tensor, block: tuple[int, int], cga_layout: tuple = ()) -> TensorDescriptor:
    """A TMA descriptor of `t` in blocks of `block`. `cga_layout` (a kernel written for a cluster of
    CTAs, compat.CLUSTER_MULTICAST): how the cluster's CTAs share each block; ((1, 0),) gives each of
    two CTAs half its rows, ((0, 0),) gives both the whole block (a multicast load)."""
    layout = _shared_layout(block, t.dtype, cga_layout)
    return TensorDescriptor(t, list(t.shape), list(tma_strides(t)), list(block), layout)


def make_descriptors(a, b, c, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, epi_split: int = 1) -> Descriptors:
    """TMA descriptors for C = A @ B; raises ValueError if an operand breaks a TMA rule.

    c is only checked for what the descriptor needs: the caller owns whatever lies between N and
    the next 16 bytes of each row (see `tma_out_unsupported_reason`).
    """
    reason = tma_unsupported_reason(a, b, c)
    if reason is not None:
        raise ValueError(f"TMA kernels: {reason}")
    a_view, a_m_major, _ = a_descriptor_view(a)
    b_view, b_k_major, _ = b_descriptor_view(b)
    return Descriptors(
        a=descriptor(a_view, (BLOCK_K, BLOCK_M) if a_m_major else (BLOCK_M, BLOCK_K)),
        b=descriptor(b_view, (BLOCK_N, BLOCK_K) if b_k_major else (BLOCK_K, BLOCK_N)),
        c=descriptor(c, (BLOCK_M, BLOCK_N // epi_split)),
        a_m_major=a_m_major,
        b_k_major=b_k_major,
    )


def planned_launch(
    kernel, grid, desc: Descriptors, constexprs: dict, c: torch.Tensor, epilogue: Epilogue = PLAIN, bias=None,
    residual=None, preact=None, trailing: tuple = (), tails: Descriptors | None = None,
):  # fmt: skip
    """Compile a Gluon kernel that takes (a_desc, b_desc, c_desc, *epilogue arguments, *trailing,
    *constexprs) for this geometry and return `launch(a, b, c, bias=None, residual=None,
    preact=None)` for tensors of the same geometry. `trailing`: arguments the same in every call.
    `tails`: a second set of descriptors on the same b and c (other boxes: odd_width.py's tile
    tails), passed after c_desc as (b's, c's).

    A descriptor is its tensor's address, shape, strides and block: only the address changes from
    call to call, so each call encodes the plan's descriptors at the new tensors' addresses
    (primitives/launch.py's CompiledLaunch.with_descriptors), 0.56 us each on the H100 machine, where
    building and checking one from scratch took about 40 us; an operand at an address it was
    called at before (a weight, always) reuses that call's encoding.
    """
    fixed = (*epilogue.fixed_args(residual, preact), *trailing)
    descriptors = (desc.a, desc.b, desc.c) if tails is None else (desc.a, desc.b, desc.c, tails.b, tails.c)
    runtime = (*descriptors, *epilogue.pointers(bias, residual, preact), *fixed)
    compiled = compile_launch(kernel, grid, runtime, {**constexprs, **epilogue.constexprs()}, c.device)
    launch = descriptor_launch(compiled, descriptors, tails=tails is not None)
    if epilogue.plain:  # matmul's launch, in the fewest steps
        return lambda a, b, c, *_: launch(a, b, c, 0, 0, 0, *fixed)

    def fused_launch(a, b, c, bias=None, residual=None, preact=None):
        launch(a, b, c, *epilogue.pointers(bias, residual, preact), *fixed)

    return fused_launch


def descriptor_launch(compiled, descriptors: tuple, tails: bool = False):
    """`launch(a, b, c, *rest)` of a compiled kernel whose first arguments are `descriptors`, each
    call moving them onto its tensors. With `tails`, the last two are a second set on b and c
    (odd_width.py's tile tails), which move onto the same b and c."""
    # A transposed operand's descriptor describes its .T: the same data pointer and dtype, which is
    # all that a launch reads from a descriptor's tensor (its shape and strides are the plan's), so
    # the operand serves.
    launch = compiled.with_descriptors(descriptors, bind)
    if not tails:
        return launch
    assert len(descriptors) == 5, "tails: a's, b's and c's descriptors, then the tails' on b and c"
    return lambda a, b, c, *rest: launch(a, b, c, b, c, *rest)


def bind(unbound: TensorDescriptor, t: torch.Tensor) -> TensorDescriptor:
    """`unbound` (a plan's descriptor) moved onto `t`, a tensor of the same geometry."""
    bound = object.__new__(TensorDescriptor)  # no __post_init__: it ran when `unbound` was built
    bound.__dict__.update(unbound.__dict__, base=t)
    return bound
