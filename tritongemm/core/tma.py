"""Host side of TMA: which operands the copy engine takes as they are, and aligned copies of
those it does not (pure torch: no Triton, no CUDA call; primitives/gluon/descriptors.py builds the
descriptors).

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

import torch

# The operand dtypes of the bf16/fp16 TMA rungs (the fp8 rungs' are fp8/tma.py's).
TMA_DTYPES = (torch.float16, torch.bfloat16)
_TMA_ALIGN_BYTES = 16
_TMA_MAX_DIM = 2**31 - 1  # Triton passes descriptor shapes as int32
# TMA reads a tile as rows of 128 bytes (the swizzle's width). Where B's rows don't start on a
# 128-byte boundary every one of those spans two, and B's tile has twice A's rows: on the H100,
# 5000 x 3000 x 7000 (B's rows 6,000 bytes) ran at 0.69-0.73x cuBLAS as given, 0.92x with B's rows
# alone padded to 128 bytes, 0.78-0.80x with A's alone (results/h100/probes/dense/probe-row-stride-ab.txt).
# A copy of B moves 4 K N bytes while what it saves, a quarter of the GEMM, grows with M: at 0.25 x
# 2MNK / 650 TFLOP/s against 4KN / 2.3 TB/s (_row_aligned_copy's speed), from M = 2300 or so.
# Measured with the copy in the call (H100, fp16 and bf16, results/h100/probes/dense/row-copy.txt), without
# and with it: 5000 x 3000 x 7000 0.69-0.74x -> 0.88-0.90x, 3000 x 5000 x 1000 0.78x -> 0.88-0.89x,
# 2048 x 5000 x 1000 0.62-0.66x -> 0.72-0.75x; but 1536 x 5000 x 2000 0.87-0.91x -> 0.87-0.88x.
# So from M = 2048.
_FAST_ROW_BYTES = 128
PAD_B_MIN_M = 2048


def tma_strides(t: torch.Tensor) -> tuple[int, int]:
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


def view_reason(name: str, t: torch.Tensor) -> str | None:
    """Why TMA can't read/write the 2D row-major view `t` directly (None if it can)."""
    if t.data_ptr() % _TMA_ALIGN_BYTES:
        return f"{name}.data_ptr() = {t.data_ptr():#x} is not 16-byte aligned (TMA needs it)"
    row_stride, col_stride = tma_strides(t)
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
    row_reason = view_reason(name, t)
    if row_reason is None:
        return t, False, None
    transposed_reason = view_reason(f"{name}.T", t.T)
    if transposed_reason is None:
        return t.T, True, None
    return t, False, f"{row_reason}; as a {transposed} operand: {transposed_reason}"


def a_descriptor_view(a: torch.Tensor) -> tuple[torch.Tensor, bool, str | None]:
    """a (M, K) as its descriptor sees it: (M, K) row-major, or (K, M) when M-major."""
    return _operand_view("a", a, "M-major")


def b_descriptor_view(b: torch.Tensor) -> tuple[torch.Tensor, bool, str | None]:
    """b (K, N) as its descriptor sees it: (K, N) row-major, or (N, K) when K-major."""
    return _operand_view("b", b, "K-major")


def tma_unsupported_reason(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> str | None:
    """Why the TMA kernels can't take these operands as they are (None if they can).

    a is (M, K), b is (K, N); c is the (M, N) output, assumed contiguous when not given (the
    API allocates it so). Pure Python: no CUDA call.
    """
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in TMA_DTYPES:
            return f"{name}.dtype is {t.dtype}; the TMA kernels take {list(TMA_DTYPES)}"
        if t.dim() != 2:
            return f"{name} must be 2D, but has shape {tuple(t.shape)}"
    if a.dtype != b.dtype:
        return f"a and b must have one dtype, but got {a.dtype} and {b.dtype}"
    reason = a_descriptor_view(a)[2]
    if reason is not None:
        return reason
    reason = b_descriptor_view(b)[2]
    if reason is not None:
        return reason
    if c is not None:
        return view_reason("c", c)
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
    if c.dtype not in TMA_DTYPES:
        return f"out.dtype is {c.dtype}; the TMA kernels write {list(TMA_DTYPES)}"
    reason = view_reason("out", c)
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
    copy_a = a_descriptor_view(a)[2] is not None
    b_view, b_transposed, b_reason = b_descriptor_view(b)  # transposed is False when b_reason says why
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
    return t.shape[0] == 1 or tma_strides(t)[0] * t.element_size() % _FAST_ROW_BYTES == 0


def rows_on_fast_boundaries(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether TMA reads both operands' rows (as their descriptors see them) in whole 128-byte lines."""
    return _rows_on_fast_boundaries(a_descriptor_view(a)[0]) and _rows_on_fast_boundaries(b_descriptor_view(b)[0])


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
# (results/h100/probes/dense/row-copy.txt). The bits are the same either way.
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
