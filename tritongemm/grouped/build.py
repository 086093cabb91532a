"""How grouped_mm's plans are built, on a problem's first call: the kernel and tile chosen
(dispatch/grouped.py), the kernel compiled, a call that allocates and launches. What they return
is kept in the plan cache (grouped/api.py); nothing here runs on a hit."""

from __future__ import annotations

import torch

import tritongemm.grouped.k_ws as grouped_k_ws
import tritongemm.grouped.ws as grouped_ws
from tritongemm.dispatch import grouped as choice
from tritongemm.grouped.tl import OFFSETS_BLOCK, _check_offsets_kernel, _groups_along_k_kernel, _groups_along_m_kernel
from tritongemm.primitives.glu import glu_backward, glu_forward  # noqa: F401  _GroupedPair's gating, for api.py
from tritongemm.primitives.launch import compile_launch
from tritongemm.primitives.tl.host import input_precision, sm_count


def grouped_call(a, b, offs, out_dtype, form, glu, tile, whole: bool = False, invariant: bool = False,
                 scales: tuple | None = None):  # fmt: skip
    """`call(a, b, offs) -> c` for operands like these: the tile chosen, the kernel compiled.
    `whole` (row groups, b of one group): offs is None and not read, the one group all of a's rows
    (`dense_pair_plan`). `invariant`: batch_invariant=True's one tile, on the `tl` kernel.
    `scales` (scale_a, scale_b), fp8 a and b (fp8/grouped.py): `call(a, b, offs, scale_a, scale_b)`
    on the `tl` kernel, the tile dequantized before its store."""
    on_cpu = a.device.type == "cpu"
    if invariant:
        tile = choice.invariant_tile(on_cpu, glu, a.element_size())
    chosen = tile
    G = b.shape[0] if form == "m" else offs.shape[0]
    rows = a.shape[0] if form == "m" else a.shape[1]
    if tile is None and scales is not None:
        tile = choice.scaled_tile(form, rows, G, on_cpu)
    tile = tile or choice.tile(rows, G, on_cpu, glu, a.element_size())
    meta = dict(tile, INPUT_PRECISION=input_precision(a.dtype), ALIGN=(1,) * 9)
    if form == "m":
        M, K = a.shape
        N = b.shape[2] // 2 if glu else b.shape[2]
        shape, kernel = (M, N), _groups_along_m_kernel
        programs = sm_count(a.device)  # on the CPU, the interpreter's virtual SMs
        grid = (programs,)
        meta.update(NUM_PROGRAMS=programs, GROUPS_POW2=1 << G.bit_length(), GLU=glu or "none",
                    INT64=max(a.numel(), b.numel(), M * N) >= 2**31, WHOLE=whole)  # fmt: skip
        c_strides = (N, 1)
        sizes = (G, M, N, K, *a.stride(), *b.stride(), *c_strides, 0 if scales is None else scales[1].stride(0))
        empty = M * N == 0 or G == 0  # no group: every row is past the last one's end, zeros
    else:
        M, N = a.shape[0], b.shape[1]
        shape, kernel = (G, M, N), _groups_along_k_kernel
        meta.pop("GROUP_SIZE_M")
        meta["INT64"] = max(a.numel(), b.numel(), G * M * N) >= 2**31
        grid = (G * -(-M // tile["BLOCK_M"]) * -(-N // tile["BLOCK_N"]),)
        sizes = (M, N, *a.stride(), *b.stride(), M * N, N, 1)
        empty = G * M * N == 0

    if empty and scales is not None:
        return lambda a, b, offs, scale_a, scale_b: torch.zeros(shape, dtype=out_dtype, device=a.device)
    if empty:
        return lambda a, b, offs, out=None: (
            torch.zeros(shape, dtype=out_dtype, device=a.device) if out is None else out.zero_()
        )
    if scales is not None:
        if glu is not None:  # the scales dequantize the product, so they would come after the gate's activation
            raise ValueError("grouped_call: fp8 scales and a gated pair do not combine")
        meta["SCALED"] = True
        launch = compile_launch(kernel, grid, (a, b, torch.empty(shape, dtype=out_dtype, device=a.device), offs,
                                               *scales, *sizes), meta, a.device)  # fmt: skip

        def scaled_call(a, b, offs, scale_a, scale_b):
            c = torch.empty(shape, dtype=out_dtype, device=a.device)
            launch(a, b, c, offs, scale_a, scale_b, *sizes)
            return c

        return scaled_call
    if form == "m" and chosen is None and not whole and choice.takes_ws(a, b, out_dtype, glu):
        return _gluon_plan(grouped_ws.plan, a, b, offs, shape, glu=glu)
    if form == "k" and chosen is None and choice.takes_k_ws(a, b, out_dtype, G):
        return _gluon_plan(grouped_k_ws.plan, a, b, offs, shape)
    c = torch.empty(shape, dtype=out_dtype, device=a.device)  # this call's, to plan on
    # whole: a stands in for the offs pointer, unread; and always for the fp8 scales' (SCALED off).
    launch = compile_launch(kernel, grid, (a, b, c, a if whole else offs, a, a, *sizes), meta, a.device)

    def call(a, b, offs, out=None):  # out: a contiguous tensor of c's shape and dtype, or None
        c = torch.empty(shape, dtype=out_dtype, device=a.device) if out is None else out
        launch(a, b, c, a if whole else offs, a, a, *sizes)
        return c

    return call


def _gluon_plan(plan, a, b, offs, shape, **options):
    """`call(a, b, offs) -> c` (shape, a's dtype) on a Gluon grouped kernel, `plan(a, b, offs, c,
    **options)` (grouped/ws.py or grouped_k_ws.py), for operands like these."""
    launch = plan(a, b, offs, torch.empty(shape, dtype=a.dtype, device=a.device), **options)

    def call(a, b, offs):
        c = torch.empty(shape, dtype=a.dtype, device=a.device)
        launch(a, b, offs, c)
        return c

    return call


def dense_pair_plan(rows: torch.Tensor, weight: torch.Tensor, activation: str):
    """`call(rows, weight, out=None) -> act(rows @ gate.T) * (rows @ up.T)` (into out, a contiguous
    (M, I), where given) for a dense gated pair of rows (M, H) and weight [gate; up] (2I, H) like
    these (checked by the caller): the row-group kernel over one group of all the rows, which it
    reads from M, so a call launches one kernel and builds no offs, on the decode tile at up to
    dispatch/grouped.py DECODE_PAIR_ROWS rows on a GPU. The launch reads the operands' addresses alone, so the weight
    goes in as it is for its (1, H, 2I) transposed view."""
    decode = rows.device.type != "cpu" and rows.shape[0] <= choice.DECODE_PAIR_ROWS
    tile = choice.decode_pair_tile(rows.element_size()) if decode else None
    planned = grouped_call(rows, weight.t().unsqueeze(0), None, rows.dtype, "m", activation, tile, whole=True)
    return lambda rows, weight, out=None: planned(rows, weight, None, out)


def offsets_check_launch(offs: torch.Tensor, length: int):
    """The offsets check's launcher (grouped/tl.py `_check_offsets_kernel`), one a device: nothing
    in the kernel is specialized, so one binary serves every offs."""
    args = (offs, offs.shape[0], length)
    return compile_launch(_check_offsets_kernel, (1,), args, dict(BLOCK=OFFSETS_BLOCK, num_warps=4), offs.device)


def grouped_ws_call(a, b, offs, glu):
    """`grouped_mm_ws`'s call: the row-group Gluon kernel (grouped/ws.py) for operands like these."""
    return _gluon_plan(grouped_ws.plan, a, b, offs, (a.shape[0], b.shape[2] // 2 if glu else b.shape[2]), glu=glu)
