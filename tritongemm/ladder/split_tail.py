"""Rung 12, the split tail: whole waves of tiles as rung 6 runs them, the short last wave split along K.

A persistent GEMM runs its tiles in waves of one tile an SM. Where the tiles are a few waves and a
fraction, the last wave leaves SMs idle, and the GEMM pays a whole wave for it: 2048 x 2560 x 8192
in bf16 is 320 tiles of 128 x 128 on the H100's 132 SMs, 2.4 waves run in three, and rung 6 ran it
at 0.80x cuBLAS (results/h100/probes/tp/tp-chunk-gemms-auto.csv; one GPU's chunk of a tensor-parallel
q,k,v projection, docs/tensor-parallel.md).

Here the rows of C are cut in two, on a tile row's boundary:
  * the head, the rows whose tiles fill whole waves: rung 6 (tma_persistent_pipelined.py) as is;
  * the tail, the rows left: rung 7 (split_k.py), each tile's K cut into S parts, S as many as make
    one wave of the tail's tiles, then the fixed-order reduction with the fused epilogue.
In the example the head is 13 tile rows (1664 rows, 260 tiles: two waves), the tail 3 (60 tiles),
split in two: 120 programs of half a tile's work each, so the three waves become two and a half,
plus the reduction's pass over 60 fp32 tiles. Both parts are views of the same a, c and epilogue
operands; the two launches run one after the other on the caller's stream.

Where a split would not give the tail's tiles two programs each (the tail is more than half a
wave), the tail runs with the head, as rung 6 alone. With fewer tiles than SMs the head is empty
and the whole problem is split along K (rung 7 with S from this rule).
"""

from __future__ import annotations

import torch

from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.ladder import split_k, tma_persistent_pipelined
from tritongemm.primitives.gluon.pipeline import _SMEM_SLACK_BYTES, H100_SHARED_MEMORY_BYTES, sequential_smem_bytes

NAME = "split_tail"


def split_rows(M: int, N: int, K: int, config: MatmulConfig, num_sms: int) -> tuple[int, int]:
    """(head_rows, S): rows [0, head_rows) in whole waves of `config`'s tiles, rows [head_rows, M)
    split along K S ways (pure: CPU-testable). (M, 1) where splitting the tail does not pay: it
    is empty, more than half a wave, or K has too few steps for two splits."""
    tiles_n = -(-N // config.BLOCK_N)
    row_tiles = -(-M // config.BLOCK_M)
    full_waves = row_tiles * tiles_n // num_sms
    head_row_tiles = full_waves * num_sms // tiles_n
    tail_tiles = (row_tiles - head_row_tiles) * tiles_n
    if tail_tiles == 0 or 2 * tail_tiles > num_sms:
        return M, 1
    head_rows = head_row_tiles * config.BLOCK_M
    wanted = num_sms // tail_tiles
    S, _ = split_k.ring_split_plan(M - head_rows, N, K, tail_config(config).with_(split_k=wanted), num_sms)
    return (head_rows, S) if S >= 2 else (M, 1)


# Where `auto` takes it (dispatch/__init__.py): rung 6's tile is 128 x 128 (its rule's choice for a few waves),
# C at least 1024 rows, K at least 4096, at most three waves, and the tail split. Measured on the H100
# beside rung 6's rules, kernel-only (eager), results/h100/probes/dense/split-tail-candidates.csv: 1280 x
# 4096 x 8192 0.89x cuBLAS (0.86x) where rung 6 ran 0.84x (0.81x); 1536 x 3072 x 4096 0.81x (0.80x)
# against 0.77x (0.77x); 1792 x 2560 x 8192 0.87x (0.84x) against 0.79x (0.80x); 2048 x 2560 x 4096
# 0.86x (0.85x) against 0.84x (0.85x); 3328 x 1536 x 8192 0.89x (0.86x) against 0.83x (0.82x); 2048
# x 2560 x 8192 0.90-0.94x in five runs, nt and nn, against 0.79-0.82x; a second run through `auto`
# (split-tail-auto.csv) agreed on every row. Below 1024 rows it lost
# (768 x 6144 x 4096: 0.74x against 0.79x; 768 x 1536 x 4096, 64 x 128 tiles split ten ways: 0.60x
# against 0.70x, 0.33x eager).
PAYS_MIN_M = 1024
PAYS_MIN_K = 4096
PAYS_MAX_WAVES = 3


def pays(M: int, N: int, K: int, num_sms: int, rung6: MatmulConfig) -> bool:
    """Whether `auto` gives this problem to the split tail rather than to rung 6's `rung6` (pure)."""
    if M < PAYS_MIN_M or K < PAYS_MIN_K or (rung6.BLOCK_M, rung6.BLOCK_N) != (128, 128):
        return False
    if rung6.num_tiles(M, N) > PAYS_MAX_WAVES * num_sms:
        return False
    return split_rows(M, N, K, rung6, num_sms)[1] > 1


def tail_config(config: MatmulConfig, elem_bytes: int = 2) -> MatmulConfig:
    """The tail's tile: the head's, with as many of its ring slots as rung 7's non-overlapped ring
    fits (its C tile shares the ring's memory, rung 6's lives beside it)."""
    stages = config.num_stages
    limit = H100_SHARED_MEMORY_BYTES - _SMEM_SLACK_BYTES
    while stages > 2 and sequential_smem_bytes(config.with_(num_stages=stages), elem_bytes) > limit:
        stages -= 1
    return config.with_(num_stages=stages)


class _Rows:
    """Rows [start, stop) of an (M, X) operand of the plan's geometry, as a view of whatever tensor
    a call passes for it. A plan's launch reads only a tensor's data pointer (linear's fast path
    passes a (batch, seq, X) activation, or a weight for its transpose: fused._serves_as_given),
    so the views take their shape and strides from the plan, not from the tensor given."""

    def __init__(self, t: torch.Tensor | None, start: int, stop: int):
        self.shape = None if t is None else (stop - start, t.shape[1])
        self.strides = None if t is None else t.stride()
        self.offset = 0 if t is None else start * t.stride(0)

    def __call__(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or self.shape is None:
            return None
        return t.as_strided(self.shape, self.strides, t.storage_offset() + self.offset)


def plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, *, num_sms=None, **epilogue):
    """`launch(a, b, c[, bias, residual, preact])` for tensors of this geometry: rung 6's plan on
    the head's rows, rung 7's on the tail's (module docstring), each checked and compiled once.
    `num_sms`: the SM count to fill (tests)."""
    M, K = a.shape
    N = b.shape[1]
    sms = num_sms or device_info.sm_count(c.device)
    head_rows, S = split_rows(M, N, K, config, sms)
    residual, preact = epilogue.get("residual"), epilogue.get("preact")
    parts = []  # (plan, row views of a, c, residual, preact)
    for start, stop in ((0, head_rows), (head_rows, M)):
        if start == stop:
            continue
        rows = tuple(_Rows(t, start, stop) for t in (a, c, residual, preact))
        epilogue_rows = dict(epilogue, residual=rows[2](residual), preact=rows[3](preact)) if epilogue else {}
        if start == 0:
            part = tma_persistent_pipelined.plan(rows[0](a), b, rows[1](c), config, num_programs=num_sms,
                                                 **epilogue_rows)  # fmt: skip
        else:
            tail = tail_config(config, a.element_size()).with_(split_k=S)
            part = split_k.plan(rows[0](a), b, rows[1](c), tail, num_sms=sms, **epilogue_rows)
        parts.append((part, rows))

    def launch(a, b, c, bias=None, residual=None, preact=None):
        for part, (a_rows, c_rows, residual_rows, preact_rows) in parts:
            part(a_rows(a), b, c_rows(c), bias, residual_rows(residual), preact_rows(preact))

    return launch


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig) -> None:
    plan(a, b, c, config)(a, b, c)
