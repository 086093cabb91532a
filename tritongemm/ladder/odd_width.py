"""Rung 6 on tiles of an odd width: 160 or 192 columns, two accumulators side by side, so that a
GEMM's tiles fill whole waves of the GPU.

Idea: a persistent GEMM takes as long as its busiest SM, and that SM runs ceil(tiles / SMs)
tiles. 512 x 2560 (one GPU's q,k,v chunk of a tensor-parallel 2048-token step) cuts into 160
tiles of rung 6's 64 x 128: 1.2 waves on 132 SMs, so the second wave runs with 28 SMs busy and
104 idle, as long as the first. Rung 6 there ran at 0.62-0.67x cuBLAS. 64 x 160 tiles cut it into
128: one wave, 97% full, at 0.90-0.94x (docs/stream-k.md). cuBLAS picks such widths itself (128 x
200, 256 x 152 on the shapes of results/h100/probes/dense/cublas-kernels.csv). Where the waves are full anyway
a tile in two parts costs about a tenth (8192^3: 0.90-0.92x against rung 6's 1.02-1.05x), and
beside other GEMMs on other streams its full waves starve them; `auto` takes it accordingly
(`pays`, dispatch/__init__.py).

Triton wants every tensor's dimensions to be powers of two, the accumulator's as much as a TMA
box's, so a 160-wide tile is two: a 128-wide main part and a 32-wide tail (192: 128 + 64). Each
K-step loads A once and B's two boxes (b_desc's and t_desc's, the tail's columns right after the
main part's), then issues two WGMMAs from the same A tile into the two accumulators; a step's
pair is waited for as one (`PairedWGMMA`). The epilogue treats the two parts as two tiles side by
side: the fused epilogue on each, each stored through a staging buffer and descriptor of its own.
Past N, TMA reads zeros and drops stores, so a last tile's tail may lie wholly outside C.

fp8 operands run the same loop (fp8_odd_width.py: tensor- or row-wise scales, `SCALES`): each part
is dequantized by its scales before the epilogue, and C, in its own dtype, is staged in its own.

Everything else is rung 6's (tma_persistent_pipelined.py): a persistent program per SM, the next
tile's first loads issued while this tile's last MMAs drain, and C's store overlapped with the
next tile. Hopper only (WGMMA). One barrier a slot: Triton 3.6's concurrency sanitizer counts each
of a slot's three loads as an arrival (pipeline.py, "Barriers per slot"), so ConSan can't check it.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_accumulator,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate

from tritongemm.core.config import MatmulConfig
from tritongemm.core.epilogue import PLAIN, Epilogue
from tritongemm.primitives.epilogue import apply_gl, scale_gl
from tritongemm.primitives.gluon.compat import tma_load
from tritongemm.primitives.gluon.descriptors import make_descriptors, planned_launch
from tritongemm.primitives.gluon.mma import wgmma_accumulator_layout
from tritongemm.primitives.gluon.pipeline import (
    _SMEM_SLACK_BYTES,
    H100_SHARED_MEMORY_BYTES,
    check_wgmma_tile,
    init_barriers,
    invalidate_barriers,
    require_sm90,
    store_tile,
)
from tritongemm.primitives.tiling.gluon import num_persistent_programs, scheduler_for

NAME = "odd_width"
# Its tiles: one warpgroup's 64 rows, 192 or 160 columns, rings as deep as shared memory allows
# beside C's two staging buffers (smem_bytes). Two warpgroups' 128 rows ran slower on the H100 at
# every shape tried, 0.72-0.87x cuBLAS where these ran 0.77-0.98x (128 x 160: 0.79x at 2048 x
# 2560 x 8192, 64 x 160 0.85x; results/h100/probes/dense/odd-width-first.csv): as one partition of 8
# warps they wait for each other at a CTA barrier around every ring wait and load, 43% of their
# issue gaps under Nsight Compute (results/h100/probes/dense/ncu-odd-width/).
TILES = (
    MatmulConfig(BLOCK_M=64, BLOCK_N=192, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=6),
    MatmulConfig(BLOCK_M=64, BLOCK_N=160, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=7),
)


def wave_fill(config: MatmulConfig, M: int, N: int, num_sms: int) -> float:
    """The share of the SMs' time the tiles keep busy: tiles / (waves x SMs), a wave being one
    tile on every SM (the last one partly empty, or partly past C's edge)."""
    tiles = config.num_tiles(M, N)
    useful = M * N / (config.BLOCK_M * config.BLOCK_N)  # tiles' worth of C, edges counted in part
    return useful / (-(-tiles // num_sms) * num_sms)


# Where `auto` takes it (dispatch/__init__.py): at most two waves of its tiles where rung 6's tile leaves a
# quarter of the SMs' time idle, on a K long enough that each tile's steps outweigh its prologue and
# epilogue; with B a weight's view (nt) its tiles at least 90% full. Measured on the H100 against
# rung 6's rules, kernel-only:
#   nt, two runs (results/h100/probes/dense/odd-width-first.csv, odd-width-auto.csv): 512 x 2560 x 8192
#   0.90-0.94x cuBLAS where rung 6 ran 0.62-0.67x, 1024 x 2560 x 8192 0.84-0.90x (0.79x), 2048 x
#   1536 x 4096 0.90-0.98x (0.85-0.86x);
#   nn, 64 x 192, two runs at 2560 columns (odd-width-nn.csv, odd-width-nn-2.csv): 512 x 2560 x
#   8192 0.97-0.98x (0.74-0.76x), 1024 rows 0.84-0.87x (0.81-0.83x), 2048 x 1536 x 4096 0.96x
#   (0.86x), 512 x 1536 x 4096 0.96x (0.78x), although its tiles fill 48-97% of their waves.
# Where it lost: past two waves (2048 x 2560 x 8192: 0.85x nt against split_tail's 0.91-0.94x,
# 0.74x nn against rung 6's 0.79x; 4096 rows 0.80-0.85x against 0.92-0.97x), and where rung 6
# filled its waves (1024 x 7168 x 8192 nn: 0.91x against 0.97-1.00x; 512 x 14336 x 8192 0.98x
# against 1.01-1.03x).
PAYS_MIN_FILL_NT = 0.9
PAYS_MAX_WAVES = 2
PAYS_RUNG6_MAX_FILL = 0.75
PAYS_MIN_K = 2048


def pays(M: int, N: int, K: int, num_sms: int, rung6: MatmulConfig, b_k_major: bool) -> bool:
    """Whether `auto` gives this problem to the odd widths rather than rung 6's `rung6` tile (pure)."""
    if K < PAYS_MIN_K:
        return False
    config = default_config(M, N, K, num_sms, b_k_major)
    waves = -(-config.num_tiles(M, N) // num_sms)
    full_enough = not b_k_major or wave_fill(config, M, N, num_sms) >= PAYS_MIN_FILL_NT
    return waves <= PAYS_MAX_WAVES and full_enough and wave_fill(rung6, M, N, num_sms) <= PAYS_RUNG6_MAX_FILL


def default_config(M: int, N: int, K: int, num_sms: int, b_k_major: bool) -> MatmulConfig:
    """Of TILES, the one whose tiles fill the waves best, the larger where two fill as well (pure:
    tests and rules call it without a GPU). With B row-major, only tails of 64 columns and more:
    a 32-column tail's rows are 64 bytes, under the 128-byte swizzle of the other boxes, and its
    tile ran 0.57-0.86x where the 192-wide one ran 0.74-0.98x (results/h100/probes/odd-width-nn*.csv)."""
    tiles = TILES if b_k_major else tuple(t for t in TILES if split_width(t.BLOCK_N)[1] >= 64)
    return max(tiles, key=lambda t: (round(wave_fill(t, M, N, num_sms), 2), t.BLOCK_M * t.BLOCK_N))


def split_width(BLOCK_N: int) -> tuple[int, int]:
    """(main, tail): the widest power of two below BLOCK_N and the rest, itself a power of two of
    at least 16 columns and at most half the main part; ValueError for other widths."""
    main = 1 << (BLOCK_N.bit_length() - 1)
    tail = BLOCK_N - main
    if not (64 <= main <= 256 and 16 <= tail <= main // 2 and tail & (tail - 1) == 0):
        raise ValueError(
            f"{NAME}: BLOCK_N must be a power of two from 64 to 256 plus a smaller one of at least 16 and at "
            f"most half of it (96, 160, 192, 320, ...), but got BLOCK_N={BLOCK_N}"
        )
    return main, tail


def smem_bytes(config: MatmulConfig, elem_bytes: int, c_elem_bytes: int | None = None) -> int:
    """The ring (A and both B boxes a slot) and C's two staging buffers, alive together; C's
    elements are the operands' size unless `c_elem_bytes` says (fp8 operands, a bf16 C)."""
    ring = config.num_stages * (config.BLOCK_M + config.BLOCK_N) * config.BLOCK_K * elem_bytes
    return ring + config.BLOCK_M * config.BLOCK_N * (c_elem_bytes or elem_bytes)


def check_config(config: MatmulConfig, elem_bytes: int, c_elem_bytes: int | None = None, name: str = NAME) -> None:
    """ValueError naming what doesn't fit: the width, the WGMMA tile, the shared memory."""
    main, _ = split_width(config.BLOCK_N)
    check_wgmma_tile(name, config.with_(BLOCK_N=main))
    if config.num_stages < 2:
        raise ValueError(f"{name}: num_stages must be >= 2 (one slot loads while the MMA reads another), got "
                         f"{config.num_stages}")  # fmt: skip
    need = smem_bytes(config, elem_bytes, c_elem_bytes)
    if need > H100_SHARED_MEMORY_BYTES - _SMEM_SLACK_BYTES:
        raise ValueError(
            f"{name}: {config.short()} needs {need} bytes of shared memory (ring and C), more than the "
            f"{H100_SHARED_MEMORY_BYTES} a block may have (less {_SMEM_SLACK_BYTES}); use fewer num_stages"
        )


@aggregate
class PairedWGMMA:
    """mma.WGMMA's interface for a tile in two parts: one K-step is two WGMMAs from one A tile,
    into the main accumulator and the tail's. Counts are of K-steps, as WGMMA's: waiting for n
    steps in flight waits for 2n instructions."""

    main: warpgroup_mma_accumulator | gl.tensor
    tail: warpgroup_mma_accumulator | gl.tensor
    use_acc: gl.tensor

    @gluon.constexpr_function
    def __init__(self, main, tail, use_acc):
        self.main = main
        self.tail = tail
        self.use_acc = use_acc

    @gluon.jit
    def initialize(dtype: gl.constexpr, BLOCK_M: gl.constexpr, MAIN_N: gl.constexpr, TAIL_N: gl.constexpr,
                   num_warps: gl.constexpr):  # fmt: skip
        main_layout: gl.constexpr = wgmma_accumulator_layout(dtype, BLOCK_M, MAIN_N, num_warps)
        tail_layout: gl.constexpr = wgmma_accumulator_layout(dtype, BLOCK_M, TAIL_N, num_warps)
        main = gl.zeros((BLOCK_M, MAIN_N), dtype=gl.float32, layout=main_layout)  # never read: use_acc=False
        tail = gl.zeros((BLOCK_M, TAIL_N), dtype=gl.float32, layout=tail_layout)
        return PairedWGMMA(main, tail, gl.to_tensor(False))

    @gluon.jit
    def issue_async_mma(self, a, b, b_tail):
        main = warpgroup_mma(a, b, self.main, is_async=True, use_acc=self.use_acc)
        tail = warpgroup_mma(a, b_tail, self.tail, is_async=True, use_acc=self.use_acc)
        return PairedWGMMA(main, tail, gl.to_tensor(True))

    @gluon.jit
    def wait_num_outstanding(self, num_outstanding: gl.constexpr):
        main, tail = warpgroup_mma_wait(2 * num_outstanding, (self.main, self.tail))
        return PairedWGMMA(main, tail, self.use_acc)

    @gluon.jit
    def take_result(self):
        """Both finished parts (wait_num_outstanding(0) first), and the state for the next tile."""
        return self.main, self.tail, PairedWGMMA(self.main, self.tail, gl.to_tensor(False))


@gluon.jit
def _issue_loads(producer, a_desc, b_desc, t_desc, off_m, off_n, k, ready, a_bufs, b_bufs, t_bufs,
                 A_M_MAJOR: gl.constexpr, B_K_MAJOR: gl.constexpr, pred):  # fmt: skip
    """K-step `producer`'s three boxes into its slot: A's, B's main columns and B's tail columns."""
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    MAIN_N: gl.constexpr = b_desc.block_type.shape[0] if B_K_MAJOR else b_desc.block_type.shape[1]
    slot = producer % NUM_BUFFERS
    bar = ready.index(slot)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + t_desc.block_type.nbytes
    mbarrier.expect(bar, nbytes, pred=pred)
    if A_M_MAJOR:
        tma_load(a_desc, [k, off_m], bar, a_bufs.index(slot), pred)
    else:
        tma_load(a_desc, [off_m, k], bar, a_bufs.index(slot), pred)
    if B_K_MAJOR:
        tma_load(b_desc, [off_n, k], bar, b_bufs.index(slot), pred)
        tma_load(t_desc, [off_n + MAIN_N, k], bar, t_bufs.index(slot), pred)
    else:
        tma_load(b_desc, [k, off_n], bar, b_bufs.index(slot), pred)
        tma_load(t_desc, [k, off_n + MAIN_N], bar, t_bufs.index(slot), pred)
    return producer + 1


@gluon.jit
def _issue_mma(consumer, mma, ready, a_bufs, b_bufs, t_bufs, A_M_MAJOR: gl.constexpr, B_K_MAJOR: gl.constexpr):
    """Wait for K-step `consumer`'s boxes, issue its two MMAs, then retire the step before it."""
    NUM_BUFFERS: gl.constexpr = a_bufs.shape[0]
    slot = consumer % NUM_BUFFERS
    mbarrier.wait(ready.index(slot), (consumer // NUM_BUFFERS) & 1)
    a = a_bufs.index(slot)
    b = b_bufs.index(slot)
    t = t_bufs.index(slot)
    if A_M_MAJOR:
        a = a.permute((1, 0))
    if B_K_MAJOR:
        b = b.permute((1, 0))
        t = t.permute((1, 0))
    mma = mma.issue_async_mma(a, b, t)
    mma = mma.wait_num_outstanding(1)
    return consumer + 1, mma


@gluon.jit
def _odd_width_kernel(
    a_desc,  # (M, K) block [BLOCK_M, BLOCK_K]; (K, M) block [BLOCK_K, BLOCK_M] if A_M_MAJOR
    b_desc,  # (K, N) block [BLOCK_K, MAIN_N]; (N, K) block [MAIN_N, BLOCK_K] if B_K_MAJOR
    c_desc,  # (M, N), block [BLOCK_M, MAIN_N]
    t_desc,  # b's tail: b_desc with TAIL_N in MAIN_N's place
    ct_desc,  # c's tail: (M, N), block [BLOCK_M, TAIL_N]
    bias_ptr,
    residual_ptr,
    preact_ptr,
    stride_rm,
    stride_rn,
    stride_pm,
    alpha,
    # fp8 operands' dequantization scales (fp32), read where SCALES says: one element each, or
    # scale_a (M,) and scale_b (N,) contiguous (fp8_odd_width.py)
    sa_ptr,
    sb_ptr,
    Scheduler: gl.constexpr,
    NUM_BUFFERS: gl.constexpr,
    A_M_MAJOR: gl.constexpr,
    B_K_MAJOR: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_ALPHA: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    SCALES: gl.constexpr,  # "none", or fp8 operands' recipe, "tensor" or "row"
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    MAIN_N: gl.constexpr = c_desc.block_type.shape[1]
    TAIL_N: gl.constexpr = ct_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0] if A_M_MAJOR else a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    K = a_desc.shape[0] if A_M_MAJOR else a_desc.shape[1]
    M = c_desc.shape[0]
    N = c_desc.shape[1]
    gl.static_assert(NUM_BUFFERS >= 2, "one slot is read by the MMA in flight while the next one loads")

    # 1. Per-program state: the ring (three boxes a slot), C's two staging buffers, the barriers.
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    t_bufs = gl.allocate_shared_memory(dtype, [NUM_BUFFERS] + t_desc.block_type.shape, t_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    ct_smem = gl.allocate_shared_memory(ct_desc.dtype, ct_desc.block_type.shape, ct_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    init_barriers(ready)
    producer = 0
    consumer = 0
    mma = PairedWGMMA.initialize(dtype, BLOCK_M, MAIN_N, TAIL_N, num_warps)
    scheduler = Scheduler.initialize(M, N, BLOCK_M, MAIN_N + TAIL_N)
    num_tiles = scheduler.get_num_tiles()

    # 2. The first tile's first NUM_BUFFERS - 1 K-steps (past K: zeros), predicated so that a
    #    program without tiles leaves no copy in flight.
    pid_m, pid_n = scheduler.get_tile(0)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * (MAIN_N + TAIL_N)
    has_work = num_tiles > 0
    for ki in gl.static_range(NUM_BUFFERS - 1):
        producer = _issue_loads(producer, a_desc, b_desc, t_desc, off_m, off_n, ki * BLOCK_K, ready, a_bufs, b_bufs,
                                t_bufs, A_M_MAJOR, B_K_MAJOR, has_work)  # fmt: skip

    for idx in range(num_tiles):
        # 3. Steady state: one step's loads and one step's MMAs per K-step.
        consumer, mma = _issue_mma(consumer, mma, ready, a_bufs, b_bufs, t_bufs, A_M_MAJOR, B_K_MAJOR)
        for k in range((NUM_BUFFERS - 1) * BLOCK_K, K, BLOCK_K):
            producer = _issue_loads(producer, a_desc, b_desc, t_desc, off_m, off_n, k, ready, a_bufs, b_bufs, t_bufs,
                                    A_M_MAJOR, B_K_MAJOR, True)  # fmt: skip
            consumer, mma = _issue_mma(consumer, mma, ready, a_bufs, b_bufs, t_bufs, A_M_MAJOR, B_K_MAJOR)

        # 4. Drain this tile's last MMAs while the next tile's first loads go out.
        out_m = off_m
        out_n = off_n
        has_next = idx + 1 < num_tiles
        pid_m, pid_n = scheduler.get_tile(gl.minimum(idx + 1, num_tiles - 1))
        off_m = pid_m * BLOCK_M
        off_n = pid_n * (MAIN_N + TAIL_N)
        for ki in gl.static_range(NUM_BUFFERS - 1):
            producer = _issue_loads(producer, a_desc, b_desc, t_desc, off_m, off_n, ki * BLOCK_K, ready, a_bufs,
                                    b_bufs, t_bufs, A_M_MAJOR, B_K_MAJOR, has_next)  # fmt: skip
            if ki < NUM_BUFFERS - 2:
                consumer, mma = _issue_mma(consumer, mma, ready, a_bufs, b_bufs, t_bufs, A_M_MAJOR, B_K_MAJOR)
        mma = mma.wait_num_outstanding(0)

        # 5. Epilogue: each part as a tile of its own, stored while the next tile computes.
        main, tail, mma = mma.take_result()
        if SCALES != "none":
            main = scale_gl(main, out_m, out_n, M, N, sa_ptr, sb_ptr, SCALES == "row")
            tail = scale_gl(tail, out_m, out_n + MAIN_N, M, N, sa_ptr, sb_ptr, SCALES == "row")
        main = apply_gl(
            main, out_m, out_n, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm, alpha,
            ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
        )  # fmt: skip
        tail = apply_gl(
            tail, out_m, out_n + MAIN_N, M, N, bias_ptr, residual_ptr, preact_ptr, stride_rm, stride_rn, stride_pm,
            alpha, ACTIVATION, HAS_ALPHA, HAS_BIAS, HAS_RESIDUAL, STORE_PREACT,
        )  # fmt: skip
        tma.store_wait(pendings=0)  # the previous tile's stores have read both buffers
        store_tile(main, c_desc, c_smem, out_m, out_n)
        store_tile(tail, ct_desc, ct_smem, out_m, out_n + MAIN_N)

    tma.store_wait(pendings=0)
    invalidate_barriers(ready)


def plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, *, num_programs: int | None = None,
         epilogue: Epilogue = PLAIN, bias=None, residual=None, preact=None):  # fmt: skip
    """`launch(a, b, c[, bias, residual, preact])` for tensors of this geometry, checked and
    compiled once; ValueError naming what it can't take. `num_programs` replaces the SM count
    (tests: several tiles a program); `epilogue` and its tensors as descriptors.planned_launch's."""
    require_sm90(NAME, c.device)
    check_config(config, a.element_size())
    main_n, tail_n = split_width(config.BLOCK_N)
    desc = make_descriptors(a, b, c, config.BLOCK_M, main_n, config.BLOCK_K)
    tails = make_descriptors(a, b, c, config.BLOCK_M, tail_n, config.BLOCK_K)  # its b and c: the tail's boxes
    grid = (num_persistent_programs(config.num_tiles(*c.shape), c.device, num_programs),)
    constexprs = dict(
        Scheduler=scheduler_for(config.scheduler, config.GROUP_SIZE_M), NUM_BUFFERS=config.num_stages,
        **desc.layout_constexprs(), SCALES="none", num_warps=config.num_warps,
    )  # fmt: skip
    # No scales (they are fp8_odd_width.py's): two integers stand for their pointers, never read.
    return planned_launch(_odd_width_kernel, grid, desc, constexprs, c, epilogue, bias, residual, preact,
                          trailing=(0, 0), tails=tails)  # fmt: skip


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: MatmulConfig, *,
           num_programs: int | None = None) -> None:  # fmt: skip
    plan(a, b, c, config, num_programs=num_programs)(a, b, c)
