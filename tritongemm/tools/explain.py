"""`tritongemm explain`: the numpy rewrite of one program's pointer arithmetic.

A line like ``a_ptrs = a_ptr + (offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak)`` builds
a whole (BLOCK_M, BLOCK_K) block of addresses by broadcasting a column of row offsets against a
row of column offsets. Printed from inside a kernel it shows only one thread's share; rewritten
in numpy with the real sizes and strides it shows the whole block. For one program this tool
prints that rewrite and what it evaluates to: which elements of A and B it loads at each K step
(offsets from the data pointer, in elements) and which elements of C it stores.

It follows the kernels line for line (primitives/tl/tiles.py): `naive` and `grouped` mask rows, columns
and K; `persistent` clamps out-of-range rows and columns to 0 (a valid address, loaded but never
stored) and masks K only. The TMA kernels compute no addresses: a TMA box load at [off_m, k]
reads the same elements as the naive masks, zero-filling what falls outside the tensor; rung
13's B boxes of an odd width (128 + 32 columns for 160) read, side by side, what one would.
`swap_ab` (with K whole: split_k = 1) loads the naive blocks transposed, for C.T's tile. The rungs
that split a tile's K across programs are not explained (REFUSED).
tests/test_tools_explain.py checks the rewrite against what the real kernels load and store.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import numpy as np

from tritongemm.core import registry
from tritongemm.core.config import MatmulConfig
from tritongemm.primitives import tiling as tile_order
from tritongemm.tools import launch as launch_mod

# The rungs explained (swap_ab with K whole), and those refused, with why.
KERNELS = launch_mod.KERNELS
REFUSED = {
    kernel: f"{why}, which this rewrite (a tile, one program, all of K) does not show"
    for kernel, why in launch_mod.SPLITS_K.items()
}


@dataclass(frozen=True)
class Operands:
    """Sizes and element strides of one GEMM: a (M, K), b (K, N), c (M, N)."""

    M: int
    N: int
    K: int
    stride_am: int
    stride_ak: int
    stride_bk: int
    stride_bn: int
    stride_cm: int
    stride_cn: int

    @classmethod
    def contiguous(cls, M: int, N: int, K: int, layout: str = "nn") -> Operands:
        """Strides of contiguous tensors; layout "tn" / "nt" / "tt": a / b / both are transposed
        views (a = A.T of a (K, M) tensor; b = W.T of an (N, K) nn.Linear weight)."""
        if layout not in ("nn", "tn", "nt", "tt"):
            raise ValueError(f"layout must be one of nn, tn, nt, tt, but got {layout!r}")
        a = (1, M) if layout[0] == "t" else (K, 1)
        b = (1, K) if layout[1] == "t" else (N, 1)
        return cls(M, N, K, *a, *b, N, 1)

    @classmethod
    def of(cls, a, b, c) -> Operands:
        """From tensors (or arrays with element strides): a (M, K), b (K, N), c (M, N)."""
        (M, K), N = a.shape, b.shape[1]
        return cls(M, N, K, *a.stride(), *b.stride(), *c.stride())


@dataclass(frozen=True)
class KStep:
    k: int  # index of the K step; it covers columns k * BLOCK_K ... of A
    a_offsets: np.ndarray  # (BLOCK_M, BLOCK_K) elements from a_ptr
    a_mask: np.ndarray  # (BLOCK_M, BLOCK_K) which of them are loaded (the rest read as 0)
    b_offsets: np.ndarray  # (BLOCK_K, BLOCK_N)
    b_mask: np.ndarray


@dataclass(frozen=True)
class TileWork:
    """Everything one program does for one output tile."""

    kernel: str
    program: int
    step: int  # position of this tile in the program's loop (0 for one-tile programs)
    pid_m: int
    pid_n: int
    offs_m: np.ndarray  # (BLOCK_M,) rows of C (and of A, before clamping)
    offs_n: np.ndarray  # (BLOCK_N,)
    offs_am: np.ndarray  # rows of A the loads use: offs_m, clamped to 0 past M in `persistent`
    offs_bn: np.ndarray
    steps: tuple[KStep, ...]
    c_offsets: np.ndarray  # (BLOCK_M, BLOCK_N) elements from c_ptr
    c_mask: np.ndarray  # which of them are stored


def explain(
    kernel: str, ops: Operands, config: MatmulConfig, program: int, num_programs: int = launch_mod.H100.num_sms
) -> list[TileWork]:
    """The tiles `program` computes under `kernel`, in loop order, with every offset and mask.

    `program` is the launch-order program id (for the 2D-grid kernels program_id(0) +
    program_id(1) * cdiv(M, BLOCK_M)); `num_programs` is the SM count persistent kernels use.
    """
    launch_mod.check_kernel(kernel, KERNELS, REFUSED, "explain")
    ordering = launch_mod.ordering_of(kernel, config.scheduler)
    launch_mod.check_config(kernel, config)
    num_pid_m, num_pid_n = tile_order.cdiv(ops.M, config.BLOCK_M), tile_order.cdiv(ops.N, config.BLOCK_N)
    s = tile_order.schedule(ordering, num_pid_m, num_pid_n, config.GROUP_SIZE_M, num_programs=num_programs)
    programs = s.num_programs
    if not 0 <= program < programs:
        raise ValueError(f"explain: {kernel} launches programs 0..{programs - 1} here, but got program={program}")
    tiles = sorted(zip(*np.nonzero(s.program == program)), key=lambda t: s.step[t])
    return [_tile_work(kernel, ops, config, program, int(s.step[t]), int(t[0]), int(t[1])) for t in tiles]


def _tile_work(kernel, ops: Operands, config: MatmulConfig, program, step, pid_m, pid_n) -> TileWork:
    BM, BN, BK = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    offs_m = pid_m * BM + np.arange(BM)
    offs_n = pid_n * BN + np.arange(BN)
    clamp = kernel == "persistent"
    offs_am = np.where(offs_m < ops.M, offs_m, 0) if clamp else offs_m
    offs_bn = np.where(offs_n < ops.N, offs_n, 0) if clamp else offs_n
    offs_k = np.arange(BK)
    a_ptrs = offs_am[:, None] * ops.stride_am + offs_k[None, :] * ops.stride_ak
    b_ptrs = offs_k[:, None] * ops.stride_bk + offs_bn[None, :] * ops.stride_bn
    steps = []
    for k in range(tile_order.cdiv(ops.K, BK)):
        k_left = ops.K - k * BK
        a_mask = offs_k[None, :] < k_left
        b_mask = offs_k[:, None] < k_left
        if not clamp:
            a_mask = (offs_m[:, None] < ops.M) & a_mask
            b_mask = b_mask & (offs_n[None, :] < ops.N)
        steps.append(
            KStep(k, a_ptrs, np.broadcast_to(a_mask, a_ptrs.shape), b_ptrs, np.broadcast_to(b_mask, b_ptrs.shape))
        )
        a_ptrs = a_ptrs + BK * ops.stride_ak
        b_ptrs = b_ptrs + BK * ops.stride_bk
    c_offsets = offs_m[:, None] * ops.stride_cm + offs_n[None, :] * ops.stride_cn
    c_mask = (offs_m[:, None] < ops.M) & (offs_n[None, :] < ops.N)
    return TileWork(
        kernel, program, step, pid_m, pid_n, offs_m, offs_n, offs_am, offs_bn, tuple(steps), c_offsets, c_mask
    )


def emulate(works: list[TileWork], a_flat: np.ndarray, b_flat: np.ndarray, c_flat: np.ndarray) -> None:
    """Do what the explained program does, on flat storage: gather the loads, multiply, scatter the
    stores into `c_flat` (in place). Tests compare this with the real kernel."""
    for w in works:
        acc = np.zeros(w.c_offsets.shape, dtype=np.float64)
        for st in w.steps:
            a = np.where(st.a_mask, a_flat[np.where(st.a_mask, st.a_offsets, 0)], 0.0)
            b = np.where(st.b_mask, b_flat[np.where(st.b_mask, st.b_offsets, 0)], 0.0)
            acc += a @ b
        c_flat[w.c_offsets[w.c_mask]] = acc[w.c_mask]


# ----------------------------------------------------------------------------------------------
# The printed rewrite
# ----------------------------------------------------------------------------------------------


def numpy_rewrite(work: TileWork, ops: Operands, config: MatmulConfig) -> str:
    """Runnable numpy for this tile, every name as in the kernel; running it leaves `a_offsets`,
    `a_masks`, `b_offsets`, `b_masks` (one entry per K step), `c_ptrs` and `c_mask` behind."""
    clamp = work.kernel == "persistent"
    tma = registry.get(work.kernel).tma
    lines = [
        "import numpy as np",
        f"M, N, K = {ops.M}, {ops.N}, {ops.K}",
        f"stride_am, stride_ak = {ops.stride_am}, {ops.stride_ak}",
        f"stride_bk, stride_bn = {ops.stride_bk}, {ops.stride_bn}",
        f"stride_cm, stride_cn = {ops.stride_cm}, {ops.stride_cn}",
        f"BLOCK_M, BLOCK_N, BLOCK_K = {config.BLOCK_M}, {config.BLOCK_N}, {config.BLOCK_K}",
        f"pid_m, pid_n = {work.pid_m}, {work.pid_n}  # program {work.program}, step {work.step}",
        "offs_m = pid_m * BLOCK_M + np.arange(BLOCK_M)  # rows of C",
        "offs_n = pid_n * BLOCK_N + np.arange(BLOCK_N)  # columns of C",
    ]
    if clamp:
        lines += [
            "offs_am = np.where(offs_m < M, offs_m, 0)  # past the edge: row 0, loaded, never stored",
            "offs_bn = np.where(offs_n < N, offs_n, 0)",
        ]
    else:
        lines += ["offs_am, offs_bn = offs_m, offs_n"]
    if tma:
        lines += ["# TMA: box [pid_m * BLOCK_M, k * BLOCK_K] of A; the hardware zero-fills past M and K"]
    if config.odd_width:
        lines += ["# B's box is two, side by side: the widest power of two of BLOCK_N's columns, then the rest"]
    if work.kernel == "swap_ab":
        lines += ["# swap_ab loads these blocks transposed, for C.T's tile = b_block.T @ a_block.T (K whole)"]
    lines += [
        "offs_k = np.arange(BLOCK_K)",
        "# (BLOCK_M, 1) column + (1, BLOCK_K) row -> (BLOCK_M, BLOCK_K) block of element offsets",
        "a_ptrs = offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak",
        "b_ptrs = offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn",
        "a_offsets, a_masks, b_offsets, b_masks = [], [], [], []",
        "for k in range(-(-K // BLOCK_K)):",
        "    k_left = K - k * BLOCK_K",
    ]
    if clamp:
        lines += [
            "    a_mask = np.broadcast_to(offs_k[None, :] < k_left, a_ptrs.shape)  # K only",
            "    b_mask = np.broadcast_to(offs_k[:, None] < k_left, b_ptrs.shape)",
        ]
    else:
        lines += [
            "    a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < k_left)",
            "    b_mask = (offs_k[:, None] < k_left) & (offs_n[None, :] < N)",
        ]
    lines += [
        "    a_offsets.append(a_ptrs); a_masks.append(a_mask)  # tl.load(a_ptr + a_ptrs, mask=a_mask, other=0)",
        "    b_offsets.append(b_ptrs); b_masks.append(b_mask)",
        "    a_ptrs = a_ptrs + BLOCK_K * stride_ak",
        "    b_ptrs = b_ptrs + BLOCK_K * stride_bk",
        "c_ptrs = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn",
        "c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # tl.store(c_ptr + c_ptrs, acc, mask=c_mask)",
    ]
    return "\n".join(lines)


def _span(values: np.ndarray) -> str:
    values = np.unique(values)
    if values.size == 0:
        return "none"
    if values.size == values[-1] - values[0] + 1:
        return f"{values[0]}..{values[-1]}"
    return f"{values.size} values in {values[0]}..{values[-1]}"


def _block(arr: np.ndarray) -> str:
    """An array on its own indented lines; 16 x 16 blocks in full, larger ones elided."""
    with np.printoptions(threshold=300, edgeitems=4, linewidth=140):
        return textwrap.indent(np.array2string(np.asarray(arr)), "    ")


def _line(arr: np.ndarray) -> str:
    with np.printoptions(threshold=20, edgeitems=4, linewidth=1000):
        return np.array2string(np.asarray(arr).ravel())


def _step_summary(work: TileWork, st: KStep, config: MatmulConfig) -> str:
    cols_k = st.k * config.BLOCK_K + np.arange(config.BLOCK_K)
    a_rows, a_cols = np.broadcast_arrays(work.offs_am[:, None], cols_k[None, :])
    b_rows, b_cols = np.broadcast_arrays(cols_k[:, None], work.offs_bn[None, :])

    def loaded(rows, cols, mask):
        if not mask.any():
            return "nothing"
        skipped = mask.size - mask.sum()
        return f"rows {_span(rows[mask])}, cols {_span(cols[mask])} ({mask.sum()} loaded, {skipped} masked)"

    return f"  k step {st.k}: A {loaded(a_rows, a_cols, st.a_mask)}; B {loaded(b_rows, b_cols, st.b_mask)}"


def format_work(work: TileWork, ops: Operands, config: MatmulConfig, all_steps: bool = False) -> str:
    """The rewrite for one tile, then what it evaluates to."""
    BM, BN, BK = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    offs_k = np.arange(BK)
    out = [f"# tile (pid_m={work.pid_m}, pid_n={work.pid_n}), step {work.step} of program {work.program}"]
    out += [numpy_rewrite(work, ops, config), "", "# what it evaluates to"]
    out += [f"offs_m  = {_line(work.offs_m)}", f"offs_n  = {_line(work.offs_n)}"]
    if work.kernel == "persistent":
        out += [f"offs_am = {_line(work.offs_am)}", f"offs_bn = {_line(work.offs_bn)}"]
    out += [
        "broadcasting, at k step 0:",
        f"  offs_am[:, None] * stride_am  ({BM}, 1) column: {_line(work.offs_am * ops.stride_am)}",
        f"  offs_k[None, :] * stride_ak   (1, {BK}) row:    {_line(offs_k * ops.stride_ak)}",
        f"  their sum, a_ptrs ({BM}, {BK}): offset of A[offs_am[i], offs_k[j]] from a_ptr",
        f"  offs_k[:, None] * stride_bk   ({BK}, 1) column: {_line(offs_k * ops.stride_bk)}",
        f"  offs_bn[None, :] * stride_bn  (1, {BN}) row:    {_line(work.offs_bn * ops.stride_bn)}",
        f"  their sum, b_ptrs ({BK}, {BN}): offset of B[offs_k[i], offs_bn[j]] from b_ptr",
    ]
    shown = work.steps if all_steps or len(work.steps) <= 2 else (work.steps[0], work.steps[-1])
    for st in shown:
        out += [
            f"k step {st.k}: a_ptrs =",
            _block(st.a_offsets),
            f"k step {st.k}: a_mask =",
            _block(st.a_mask.astype(int)),
            f"k step {st.k}: b_ptrs =",
            _block(st.b_offsets),
            f"k step {st.k}: b_mask =",
            _block(st.b_mask.astype(int)),
        ]
    out += ["c_ptrs =", _block(work.c_offsets), "c_mask =", _block(work.c_mask.astype(int)), ""]
    out += ["# in words"]
    out += [_step_summary(work, st, config) for st in work.steps]
    stored = work.c_offsets[work.c_mask]
    out += [f"  store: C rows {_span(work.offs_m[work.offs_m < ops.M])}, cols {_span(work.offs_n[work.offs_n < ops.N])}"
            f" ({stored.size} elements stored, {work.c_mask.size - stored.size} masked)"]  # fmt: skip
    return "\n".join(out)


def format_explanation(
    kernel: str, ops: Operands, config: MatmulConfig, program: int, num_programs: int, step=None, all_steps=False
) -> str:
    works = explain(kernel, ops, config, program, num_programs)
    ordering = launch_mod.ordering_of(kernel, config.scheduler)
    head = [f"{kernel} ({ordering} order), program {program}"]
    if ordering == "column_major" and works:
        head[0] += f" = program_id(0) {works[0].pid_m}, program_id(1) {works[0].pid_n} (2D grid)"
    head += [
        f"A ({ops.M}, {ops.K}) strides ({ops.stride_am}, {ops.stride_ak}); B ({ops.K}, {ops.N}) strides "
        f"({ops.stride_bk}, {ops.stride_bn}); C ({ops.M}, {ops.N}) strides ({ops.stride_cm}, {ops.stride_cn}); "
        f"tiles {config.BLOCK_M}x{config.BLOCK_N}x{config.BLOCK_K}",
    ]
    if not works:
        return "\n".join(head + ["this program gets no tile (more programs than tiles)"])
    if len(works) > 1:
        head += [f"it computes {len(works)} tiles: " + ", ".join(f"({w.pid_m}, {w.pid_n})" for w in works)]
    chosen = works[:1] if step is None else [w for w in works if w.step == step]
    if not chosen:
        raise ValueError(f"explain: program {program} has steps 0..{len(works) - 1}, but got step={step}")
    return "\n".join(head + [""] + [format_work(w, ops, config, all_steps) for w in chosen])
