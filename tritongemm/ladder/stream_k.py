"""Rung 10, stream-K: every program gets the same number of K-steps, wherever the tiles end.

A GEMM of T output tiles on P SMs runs in ceil(T / P) waves, and the last wave may be mostly
idle: 777 x 4096 x 4096 in 128 x 128 tiles is 224 tiles, one full wave of 132 and a second of 92
that leaves 40 SMs idle (the top rungs measured 0.67x cuBLAS there). Stream-K lays the T x I
K-steps of all the tiles (I = K / BLOCK_K each) end to end, tile after tile, and gives program p
the contiguous range [p * T * I // P, (p + 1) * T * I // P): all programs do the same work, up
to one step. A range covers whole tiles, which the program finishes and stores with the fused
epilogue as any rung does, and at its ends pieces of at most two tiles. Those pieces go, in fp32,
to the program's two workspace slots (0: the piece its range begins with, 1: the one it ends
with), and a second kernel adds each split tile's pieces in the order of their programs, which is
the order of K, applies the epilogue and stores it: the same bits on every run, as in split-K
(primitives/tl/split.py), with no program waiting on another.

Which tiles are split, and which slots hold their pieces, follows from T, I and P alone
(`segments`, the pure-Python plan that the tests compare with the kernel's results), so it is
computed once per problem; only the split tiles are launched for the fix-up.

Experimental: verified under the interpreter (tests/test_stream_k.py), not yet run on a GPU, so
"auto" and `tritongemm tune` leave it out until the H100 has measured it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import PLAIN, Epilogue
from tritongemm.primitives.epilogue import apply_tl
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tiling.tl import grouped_tile
from tritongemm.primitives.tl import host as _host
from tritongemm.primitives.tl.split import piece_alignment
from tritongemm.primitives.tl.tiles import dot_tile, store_tile, tile_offsets


@triton.jit
def _range_start(p, total, P):
    """First K-step (of all T x I) of program p."""
    return tl.cast(p, tl.int64) * total // P


# fmt: off
@triton.jit
def _stream_k_kernel(
    a_ptr, b_ptr, c_ptr,  # A (M, K), B (K, N), C (M, N)
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    workspace_ptr,  # (2 P, BLOCK_M, BLOCK_N) fp32: slot 2p + 0 / 1, the first / last piece of program p
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr,
    ALIGN: tl.constexpr,  # _host.alignment_hints of (a, b, c)
    ALIGN_SPLIT: tl.constexpr,  # the same, K's being what divides a piece's K too (stream_k.plan)
    PIECES: tl.constexpr,  # some tile is split (else workspace_ptr is 0, and no piece is written)
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):
    # fmt: on
    # 1. My range of K-steps, over all tiles laid end to end.
    p = tl.program_id(0)
    P = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    steps = tl.cdiv(K, BLOCK_K)  # I, per tile
    total = tl.cast(num_pid_m * num_pid_n, tl.int64) * steps
    start = _range_start(p, total, P)
    end = _range_start(p + 1, total, P)
    offs_tile_m = tl.arange(0, BLOCK_M)
    offs_tile_n = tl.arange(0, BLOCK_N)
    slot_tile = workspace_ptr + offs_tile_m[:, None] * BLOCK_N + offs_tile_n[None, :]

    # 2. Walk it one tile piece at a time: [k_first, k_last) of tile `tile`.
    step = start
    while step < end:
        tile = tl.cast(step // steps, tl.int32)
        k_first = tl.cast(step % steps, tl.int32)
        k_last = tl.cast(tl.minimum(steps, k_first + (end - step)), tl.int32)
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INT64)
        k_begin = k_first * BLOCK_K
        if INT64:
            k_begin = tl.cast(k_begin, tl.int64)
        acc = dot_tile(
            a_ptr + k_begin * stride_ak, b_ptr + k_begin * stride_bk, offs_m, offs_n, M, N,
            tl.minimum(K - k_first * BLOCK_K, (k_last - k_first) * BLOCK_K),
            stride_am, stride_ak, stride_bk, stride_bn,
            BLOCK_M, BLOCK_N, BLOCK_K, MASK_MN=True, INPUT_PRECISION=INPUT_PRECISION, ALIGN=ALIGN_SPLIT,
        )  # fmt: skip
        if (k_first == 0) & (k_last == steps):  # the whole tile is mine: finish it here
            acc = apply_tl(
                acc, offs_m, offs_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm,
                alpha, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
            )  # fmt: skip
            store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)
        elif PIECES:  # a piece: slot 0 if my range begins with it, else slot 1 (it ends my range)
            slot = 2 * tl.cast(p, tl.int64) + tl.where(step == start, 0, 1)
            tl.store(slot_tile + slot * (BLOCK_M * BLOCK_N), acc)
        step += k_last - k_first


# fmt: off
@triton.jit
def _fixup_kernel(
    split_tiles_ptr,  # the tiles more than one program computed (int32), one per program here
    workspace_ptr, c_ptr, M, N, K, stride_cm, stride_cn,
    bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha, P,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    INT64: tl.constexpr, ALIGN: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):
    # fmt: on
    """C tile = epilogue(the tile's pieces added in the order of their programs, i.e. of K)."""
    tile = tl.load(split_tiles_ptr + tl.program_id(0))
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    steps = tl.cdiv(K, BLOCK_K)
    total = tl.cast(num_pid_m * num_pid_n, tl.int64) * steps
    first_step = tl.cast(tile, tl.int64) * steps
    # The programs whose ranges hold the tile's first and last step: owner(s) = ceil((s + 1) P / total) - 1.
    p_first = tl.cast(((first_step + 1) * P + total - 1) // total - 1, tl.int32)
    p_last = tl.cast(((first_step + steps) * P + total - 1) // total - 1, tl.int32)
    offs_tile_m = tl.arange(0, BLOCK_M)
    offs_tile_n = tl.arange(0, BLOCK_N)
    slot_tile = workspace_ptr + offs_tile_m[:, None] * BLOCK_N + offs_tile_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for p in range(p_first, p_last + 1):
        # Slot 0 holds the piece a range begins with: every program's here but maybe the first's,
        # whose range may begin before this tile (then the piece ends its range: slot 1).
        starts_here = _range_start(p, total, P) >= first_step
        slot = 2 * tl.cast(p, tl.int64) + tl.where(starts_here, 0, 1)
        acc += tl.load(slot_tile + slot * (BLOCK_M * BLOCK_N))
    pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
    offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INT64)
    acc = apply_tl(
        acc, offs_m, offs_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
        ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
    )  # fmt: skip
    store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, ALIGN)


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    program: int
    tile: int
    k_first: int  # K-steps [k_first, k_last) of the tile
    k_last: int
    slot: int | None  # the workspace slot (2 program + 0 or 1) of a split tile's piece; None: stored whole


def segments(num_tiles: int, steps: int, programs: int) -> list[Piece]:
    """What each program computes, in the kernel's order (pure: the tests' model of the kernel).
    No more programs than K-steps (plan's P), so that no range is empty."""
    total = num_tiles * steps
    assert 0 < programs <= total, "every program gets at least one K-step"
    pieces = []
    for p in range(programs):
        start, end = p * total // programs, (p + 1) * total // programs
        step = start
        while step < end:
            tile, k_first = divmod(step, steps)
            k_last = min(steps, k_first + end - step)
            whole = k_first == 0 and k_last == steps
            pieces.append(Piece(p, tile, k_first, k_last, None if whole else 2 * p + (0 if step == start else 1)))
            step += k_last - k_first
    return pieces


def split_tiles(num_tiles: int, steps: int, programs: int) -> list[int]:
    """The tiles that more than one program computes: those the fix-up kernel finishes (programs
    as in `segments`)."""
    total = num_tiles * steps
    assert 0 < programs <= total, "every program gets at least one K-step"
    owner = lambda step: -(-(step + 1) * programs // total) - 1  # noqa: E731  (the kernels' formula)
    return [t for t in range(num_tiles) if owner(t * steps) != owner((t + 1) * steps - 1)]


def plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, *, num_sms=None, **epilogue):
    """`launch(a, b, c)` for tensors of this geometry: P = min(#SMs, K-steps) programs over equal
    ranges of K-steps, then the fix-up of the split tiles (none: one launch). `num_sms`: the
    program count to use (tests)."""
    M, K = a.shape
    N = b.shape[1]
    num_tiles, steps = config.num_tiles(M, N), triton.cdiv(K, config.BLOCK_K)
    P = min(num_sms or _host.sm_count(c.device), num_tiles * steps)
    split = split_tiles(num_tiles, steps, P)
    constexprs = _host.common_constexprs(a, b, c)
    constexprs |= dict(
        BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, GROUP_SIZE_M=config.GROUP_SIZE_M,
        num_warps=config.num_warps, num_stages=config.num_stages, ALIGN_SPLIT=piece_alignment(constexprs["ALIGN"], K),
        PIECES=bool(split),
    )  # fmt: skip
    if not split:  # every program's range is whole tiles: no piece to add up, no workspace
        return _host.planned_launch(_stream_k_kernel, (P,), a, b, c, constexprs, middle=(0,), **epilogue)
    return _with_fixup(a, b, c, constexprs, P, split, **epilogue)


def _with_fixup(a, b, c, constexprs: dict, P: int, split: list[int], epilogue: Epilogue = PLAIN, bias=None,
                residual=None, preact=None):  # fmt: skip
    """plan's launch when some tiles are split: the main kernel writes their pieces to a workspace
    of its own per call, the fix-up adds them and applies the epilogue."""
    M, K = a.shape
    N = b.shape[1]
    fixed = epilogue.fixed_args(residual, preact)
    slots = (2 * P, constexprs["BLOCK_M"], constexprs["BLOCK_N"])
    workspace = torch.empty(slots, device=c.device, dtype=torch.float32)
    args = _host.gemm_args(a, b, c)
    sizes_and_strides = args[3:]
    runtime = (*args, workspace, *epilogue.pointers(bias, residual, preact), *fixed)
    main = compile_launch(_stream_k_kernel, (P,), runtime, constexprs | epilogue.constexprs(), c.device)
    split_ids = torch.tensor(split, device=c.device, dtype=torch.int32)
    fixup_meta = {
        name: constexprs[name] for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_SIZE_M", "INT64", "ALIGN")
    } | epilogue.constexprs()
    pointers = epilogue.pointers(bias, residual, preact)
    fixup_runtime = (split_ids, workspace, c, M, N, K, *c.stride(), *pointers, *fixed, P)
    fixup = compile_launch(_fixup_kernel, (len(split),), fixup_runtime, fixup_meta, c.device)
    c_strides = c.stride()
    del workspace  # each call takes its own: calls on several streams must not share one

    def launch(a, b, c, bias=None, residual=None, preact=None):
        workspace = torch.empty(slots, device=c.device, dtype=torch.float32)
        pointers = epilogue.pointers(bias, residual, preact)
        main(a, b, c, *sizes_and_strides, workspace, *pointers, *fixed)
        fixup(split_ids, workspace, c, M, N, K, *c_strides, *pointers, *fixed, P)

    return launch


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig) -> None:
    plan(a, b, c, config)(a, b, c)
