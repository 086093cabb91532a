"""Host side of TMA: which operands the copy engine takes as they are, and their descriptors.

A TMA descriptor describes a 2D tensor by base address, shape and strides; the hardware wants
the base 16-byte aligned, the innermost stride 1 and every other stride a multiple of 16 bytes.
Shapes are free: a block that runs past the tensor is zero-filled on load and clipped on store,
which is why the kernels need no masks and take any M, N, K >= 1 (a 128 x 64 block on a 1 x 64
tensor loads one real row and 127 zero rows). One catch: stores are clipped in whole 16-byte
chunks, so C's rows must end on 16 bytes, or own the padding after them (`empty_output`).

Each operand comes in two layouts, all four pairs without a copy:
  * A row-major (M, K), a.stride(1) == 1: tiles of [BLOCK_M, BLOCK_K];
  * A "M-major", the transpose of a (K, M) row-major tensor (a weight gradient's dY^T),
    a.stride(0) == 1: the descriptor is built on a.T, tiles of [BLOCK_K, BLOCK_M];
  * B row-major (K, N), b.stride(1) == 1: tiles of [BLOCK_K, BLOCK_N];
  * B "K-major", the transpose of an (N, K) row-major weight as nn.Linear stores it,
    b.stride(0) == 1: the descriptor is built on b.T, tiles of [BLOCK_N, BLOCK_K].
The MMA reads a tile that arrived the other way round through a transposed shared-memory view.
Row-major wins where both layouts work (a vector, a 1 x 1 operand).
"""

import functools
from dataclasses import dataclass

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tritongemm.epilogue import PLAIN, Epilogue
from tritongemm.fast_launch import compile_launch

GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
# The fp8 operands of the fp8 rungs (fp8/; hopper/fp8_tma.py, fp8_ws.py, fp8_block.py): the bf16 rungs do not take them.
FP8_GL_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}
_TMA_ALIGN_BYTES = 16
_TMA_MAX_DIM = 2**31 - 1  # Triton passes descriptor shapes as int32
# TMA reads a tile as rows of 128 bytes (the swizzle's width). Where B's rows don't start on a
# 128-byte boundary every one of those spans two, and B's tile has twice A's rows: on the H100,
# 5000 x 3000 x 7000 (B's rows 6,000 bytes) ran at 0.69-0.73x cuBLAS as given, 0.92x with B's rows
# alone padded to 128 bytes, 0.78-0.80x with A's alone (results/h100/probe-row-stride-ab.txt).
# A copy of B moves 4 K N bytes while what it saves, a quarter of the GEMM, grows with M: at 0.25 x
# 2MNK / 650 TFLOP/s against 4KN / 2.3 TB/s (_row_aligned_copy's speed), from M = 2300 or so.
# Measured with the copy in the call (H100, fp16 and bf16, results/h100/row-copy.txt), without
# and with it: 5000 x 3000 x 7000 0.69-0.74x -> 0.88-0.90x, 3000 x 5000 x 1000 0.78x -> 0.88-0.89x,
# 2048 x 5000 x 1000 0.62-0.66x -> 0.72-0.75x; but 1536 x 5000 x 2000 0.87-0.91x -> 0.87-0.88x.
# So from M = 2048.
_FAST_ROW_BYTES = 128
PAD_B_MIN_M = 2048


def _tma_strides(t: torch.Tensor) -> tuple[int, int]:
    """t's strides with those of size-1 dims (never stepped over, and arbitrary in PyTorch, e.g.
    after x[None]) replaced by a value TMA accepts."""
    rows, cols = t.shape
    row_stride, col_stride = t.stride()
    if cols == 1:
        col_stride = 1
    if rows == 1:
        per_16_bytes = _TMA_ALIGN_BYTES // t.element_size()
        row_stride = -(-cols // per_16_bytes) * per_16_bytes
    return row_stride, col_stride


def _view_reason(name: str, t: torch.Tensor) -> str | None:
    """Why TMA can't read/write the 2D row-major view `t` directly (None if it can)."""
    if t.data_ptr() % _TMA_ALIGN_BYTES:
        return f"{name}.data_ptr() = {t.data_ptr():#x} is not 16-byte aligned (TMA needs it)"
    row_stride, col_stride = _tma_strides(t)
    if col_stride != 1:
        return f"{name} needs a unit stride along its last dim, but its strides are {tuple(t.stride())}"
    if row_stride * t.element_size() % _TMA_ALIGN_BYTES:
        return (
            f"{name}'s row stride is {row_stride} elements = {row_stride * t.element_size()} bytes, "
            f"not a multiple of 16 bytes as TMA requires (pad the rows to a multiple of "
            f"{_TMA_ALIGN_BYTES // t.element_size()} elements)"
        )
    if max(t.shape) > _TMA_MAX_DIM:
        return f"{name} has shape {tuple(t.shape)}: TMA descriptors here take dims below 2**31"
    return None


def _operand_view(name: str, t: torch.Tensor, transposed: str) -> tuple[torch.Tensor, bool, str | None]:
    """The view of operand `t` the descriptor is built on (t, or t.T), whether it is t.T (the
    `transposed` layout: "M-major" for A, "K-major" for B), and why not if neither works."""
    row_reason = _view_reason(name, t)
    if row_reason is None:
        return t, False, None
    transposed_reason = _view_reason(f"{name}.T", t.T)
    if transposed_reason is None:
        return t.T, True, None
    return t, False, f"{row_reason}; as a {transposed} operand: {transposed_reason}"


def _a_view(a: torch.Tensor) -> tuple[torch.Tensor, bool, str | None]:
    """a (M, K) as its descriptor sees it: (M, K) row-major, or (K, M) when M-major."""
    return _operand_view("a", a, "M-major")


def _b_view(b: torch.Tensor) -> tuple[torch.Tensor, bool, str | None]:
    """b (K, N) as its descriptor sees it: (K, N) row-major, or (N, K) when K-major."""
    return _operand_view("b", b, "K-major")


def tma_unsupported_reason(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> str | None:
    """Why the TMA kernels can't take these operands as they are (None if they can).

    a is (M, K), b is (K, N); c is the (M, N) output, assumed contiguous when not given (the
    API allocates it so). Pure Python: no CUDA call.
    """
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in GL_DTYPES:
            return f"{name}.dtype is {t.dtype}; the TMA kernels take {list(GL_DTYPES)}"
        if t.dim() != 2:
            return f"{name} must be 2D, but has shape {tuple(t.shape)}"
    if a.dtype != b.dtype:
        return f"a and b must have one dtype, but got {a.dtype} and {b.dtype}"
    reason = _a_view(a)[2]
    if reason is not None:
        return reason
    reason = _b_view(b)[2]
    if reason is not None:
        return reason
    if c is not None:
        return _view_reason("c", c)
    n, elem = b.shape[1], b.element_size()
    if n * elem % _TMA_ALIGN_BYTES:  # also for M = 1: the last 16-byte chunk would overrun the row
        return (
            f"a contiguous C of N = {n} columns has rows of {n * elem} bytes, not a multiple of 16 as "
            f"the TMA store requires (allocate C with `empty_output`, rows padded to a multiple of "
            f"{_TMA_ALIGN_BYTES // elem} elements)"
        )
    return None


def tma_out_unsupported_reason(c: torch.Tensor) -> str | None:
    """Why the TMA store can't write the (M, N) output `c` in place (None if it can).

    Besides the descriptor rules, TMA stores write whole 16-byte chunks: when a row of c ends
    inside one (N * element size not a multiple of 16), the store also overwrites the bytes after
    it, up to the chunk's end (triton-lang/triton#11583), which in a user's `out` view belong to
    someone else. `empty_output` allocates an output whose row padding is scratch instead.
    """
    if c.dtype not in GL_DTYPES:
        return f"out.dtype is {c.dtype}; the TMA kernels write {list(GL_DTYPES)}"
    reason = _view_reason("out", c)
    if reason is None and c.shape[1] * c.element_size() % _TMA_ALIGN_BYTES:
        reason = (
            f"out has N = {c.shape[1]} columns, {c.shape[1] * c.element_size()} bytes a row: TMA stores "
            f"write whole 16-byte chunks and would overwrite the bytes after each row"
        )
    return reason


def empty_output(M: int, N: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized (M, N) output the TMA kernels can store to for any N: contiguous when
    N * element size is a multiple of 16 bytes, else a view of storage whose rows are padded to
    16 bytes (the padding is overwritten with junk by the stores)."""
    padded_n = _padded_columns(N, dtype)
    storage = torch.empty((M, padded_n), dtype=dtype, device=device)
    return storage if padded_n == N else storage[:, :N]


def _padded_columns(N: int, dtype: torch.dtype, row_multiple_bytes: int = _TMA_ALIGN_BYTES) -> int:
    per_chunk = row_multiple_bytes // dtype.itemsize
    return -(-N // per_chunk) * per_chunk


def aligned_copy_fits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether plan_operands' aligned copies make any a and b of these shapes TMA-readable: they
    do unless a dimension is past what a descriptor takes."""
    return max(*a.shape, *b.shape) <= _TMA_MAX_DIM


def plan_operands(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, out_dtype: torch.dtype):
    """`prepare(a, b, out) -> (a, b, c)` for operands of this geometry, for `matmul`: a and b as
    given where TMA reads them in place, else copied into rows padded to 16 bytes; c is `out`
    where TMA can store to it in place, else a fresh padded output that `matmul` copies into out
    (or returns, made contiguous). Decided here once; the returned function only does it.
    C is in the operands' dtype (`any_out_dtype` is False for these kernels)."""
    assert out_dtype == a.dtype, "the TMA kernels write C in the operands' dtype"
    too_big = [name for name, t in (("a", a), ("b", b)) if max(t.shape) > _TMA_MAX_DIM]
    if too_big:  # no copy helps: refuse before allocating one
        raise ValueError(
            f"TMA kernels: {' and '.join(too_big)} has a dimension of 2**31 or more, past what "
            "their descriptors take; use kernel='auto' or a triton.language kernel"
        )
    copy_a = _a_view(a)[2] is not None
    b_view, b_transposed, b_reason = _b_view(b)  # transposed is False when b_reason says why
    copy_b = b_reason is not None or (a.shape[0] >= PAD_B_MIN_M and not _rows_on_fast_boundaries(b_view))
    # B is copied in the layout its descriptor reads (a K-major B as the transpose of a row-padded
    # (N, K) copy; an unreadable B is taken as row-major), so the copy reads and writes whole rows.
    # A K-major B copied into (K, N) rows was a transposing copy: on the H100 tt 3000 x 5000 x 1000
    # ran 0.60-0.64x cuBLAS with it, where tn (B row-major, the same copy's bytes) ran 0.91-0.93x.
    out_in_place = out is not None and tma_out_unsupported_reason(out) is None
    M, N = a.shape[0], b.shape[1]
    padded_n = _padded_columns(N, a.dtype)

    def prepare(a, b, out):
        if out_in_place:
            c = out
        else:  # empty_output's, by a.new_empty: 1 us less per call than torch.empty(..., dtype=, device=)
            c = a.new_empty((M, padded_n))
            c = c if padded_n == N else c[:, :N]
        if copy_a:
            a = _row_aligned_copy(a)
        if copy_b:
            b = _row_aligned_copy(b.T, _FAST_ROW_BYTES).T if b_transposed else _row_aligned_copy(b, _FAST_ROW_BYTES)
        return a, b, c

    return prepare


def _rows_on_fast_boundaries(t: torch.Tensor) -> bool:
    """Whether the 2D view `t`'s rows are 128 bytes apart times a whole number (PAD_B_MIN_M's
    why). The stride alone: a plan is keyed by strides, and torch's CUDA allocator starts
    every tensor on 512 bytes."""
    return t.shape[0] == 1 or _tma_strides(t)[0] * t.element_size() % _FAST_ROW_BYTES == 0


def rows_on_fast_boundaries(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether TMA reads both operands' rows (as their descriptors see them) in whole 128-byte lines."""
    return _rows_on_fast_boundaries(_a_view(a)[0]) and _rows_on_fast_boundaries(_b_view(b)[0])


def _row_aligned_copy(t: torch.Tensor, row_multiple_bytes: int = _TMA_ALIGN_BYTES) -> torch.Tensor:
    """A copy of t whose rows are padded to a multiple of `row_multiple_bytes`."""
    rows, cols = t.shape
    storage = torch.empty((rows, _padded_columns(cols, t.dtype, row_multiple_bytes)), dtype=t.dtype, device=t.device)
    copy = storage[:, :cols]
    source, target = _widest_views(t.detach(), copy)
    target.copy_(source)
    return copy


# torch's copy_ between views with padded rows costs an index computation per element, so wider
# elements move more bytes for it: on the H100, 7000 x 3000 fp16 into rows padded to 128 bytes took
# 58 us as fp16 (1.4 TB/s) and 36 us as int64 (2.3 TB/s); 1000 x 5000, 19 and 13 us
# (results/h100/row-copy.txt). The bits are the same either way.
_WIDE_ELEMENTS = ((8, torch.int64), (4, torch.int32))


def _widest_views(source: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """source and target (2D, one shape and dtype) as views of the widest integer elements that
    their addresses, row strides and row lengths are multiples of (as they are, if none is wider)."""
    size = source.element_size()
    if source.stride(1) != 1 or target.stride(1) != 1 or source.numel() == 0:
        return source, target
    byte_counts = (source.data_ptr(), target.data_ptr(), source.stride(0) * size, target.stride(0) * size,
                   source.shape[1] * size)  # fmt: skip
    for width, dtype in _WIDE_ELEMENTS:
        if width > size and all(count % width == 0 for count in byte_counts):
            try:
                return source.view(dtype), target.view(dtype)
            except RuntimeError:  # a storage offset torch's view won't take: narrower ones may
                continue
    return source, target


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
def _shared_layout(block: tuple[int, int], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(list(block), (GL_DTYPES | FP8_GL_DTYPES)[dtype])


def _descriptor(t: torch.Tensor, block: tuple[int, int]) -> TensorDescriptor:
    return TensorDescriptor(t, list(t.shape), list(_tma_strides(t)), list(block), _shared_layout(block, t.dtype))


def make_descriptors(a, b, c, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, epi_split: int = 1) -> Descriptors:
    """TMA descriptors for C = A @ B; raises ValueError if an operand breaks a TMA rule.

    c is only checked for what the descriptor needs: the caller owns whatever lies between N and
    the next 16 bytes of each row (see `tma_out_unsupported_reason`).
    """
    reason = tma_unsupported_reason(a, b, c)
    if reason is not None:
        raise ValueError(f"TMA kernels: {reason}")
    a_view, a_m_major, _ = _a_view(a)
    b_view, b_k_major, _ = _b_view(b)
    return Descriptors(
        a=_descriptor(a_view, (BLOCK_K, BLOCK_M) if a_m_major else (BLOCK_M, BLOCK_K)),
        b=_descriptor(b_view, (BLOCK_N, BLOCK_K) if b_k_major else (BLOCK_K, BLOCK_N)),
        c=_descriptor(c, (BLOCK_M, BLOCK_N // epi_split)),
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
    (fast_launch.CompiledLaunch.with_descriptors), 0.56 us each on the H100 machine, where
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
