"""How a kernel lays its programs over the GPU: tile ordering, program count, residency, waves.

The shared ground of the tools. Which tile a program computes comes from `tritongemm.primitives.tiling`
(the functions the kernels are tested against); this module adds what the GPU does with the
programs: how many run on one SM at once, and which tiles run at the same time ("a wave").

- One tile per program (naive, grouped, tma_pipelined, swap_ab): the hardware starts programs in
  launch order as SM slots free up; a wave is `num_sms x programs_per_sm` consecutive programs.
- Persistent kernels launch P = min(num_sms, tiles) programs; wave s is step s of every program.

Every tool here assumes that a tile is one program's, over all of K: the rungs that give a tile's
K to several programs (SPLITS_K) are refused by name, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tritongemm import dispatch
from tritongemm.core import device_info, registry
from tritongemm.core.config import MatmulConfig
from tritongemm.dispatch import tiles
from tritongemm.primitives import tiling as tile_order

# The persistent Gluon rungs' tile order: tile_order's "persistent" (strided, grouped) or "chunked",
# as config.scheduler says.
SCHEDULED = "scheduled"
# Each rung's tile order, in tile_order's terms, for every rung the tools model.
TILE_ORDERS = {
    "naive": "column_major",  # 2D grid, axis 0 fastest
    "grouped": "grouped",
    "persistent": "persistent",  # the triton.language rung has only the strided-grouped loop
    "tma_pipelined": "column_major",  # 2D grid
    "tma_persistent": SCHEDULED,
    "tma_persistent_pipelined": SCHEDULED,
    # Rung 8 computes C.T's tiles row by row, C's column by column (`tile % num_pid_m`), a program
    # a tile while K stays whole: config.split_k = 1 (a split: SWAP_AB_SPLITS).
    "swap_ab": "column_major",
    # Rungs 9 and 11 (warp-specialized) lay their tiles out as rung 6 does: one program per SM over the
    # same schedulers; ping-pong's two consumers take a program's tiles in turn, on one SM.
    "tma_warp_specialized": SCHEDULED,
    "tma_ping_pong": SCHEDULED,
    "odd_width": SCHEDULED,  # rung 6's schedulers over 160- or 192-wide tiles
}
# The rungs that give one tile's K to several programs, which no tool here draws or models.
SPLITS_K = {
    "split_k": "splits K across programs (S programs a tile, their fp32 partials summed by a second kernel)",
    "stream_k": "splits K across programs (equal ranges of K-steps, across the tiles' boundaries)",
    "split_tail": "splits K across programs (the tiles of a short last wave, as split_k)",
}
# Rung 8 splits K too, where its tiles are too few for the SMs: its default config does from K >=
# 2N (swap_ab.default_config), which the models of l2 and predict (each problem at its default
# config) would get wrong; schedule and explain draw it with K whole.
SWAP_AB_SPLITS = "splits K across programs where its tiles are too few for the SMs (its default from K >= 2N)"
KERNELS = tuple(k.name for k in registry.all_kernels("matmul") if k.name in TILE_ORDERS)  # ladder order
PERSISTENT = tuple(k for k in KERNELS if TILE_ORDERS[k] in ("persistent", SCHEDULED))
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class GPU:
    name: str
    device_name: str  # as torch names it: which dispatch table applies
    capability: tuple[int, int]
    num_sms: int
    l2_bytes: int
    smem_per_sm: int  # bytes a program may share out of; 227 KB usable per block + 1 KB reserved
    regs_per_sm: int  # 32-bit registers
    max_warps_per_sm: int
    peak_tflops: dict  # dense tensor-core peak per operand dtype (datasheet)
    dram_tbps: float  # measured device-to-device copy bandwidth, TB/s


# H100 SXM5: 989 TFLOP/s dense bf16/fp16 (494 tf32) on the datasheet; a large copy runs at about
# 3.0 TB/s of the 3.35 TB/s HBM3 peak; 50 MB of L2 (what torch reports as L2_cache_size).
H100 = GPU(
    name="H100 SXM",
    device_name="NVIDIA H100 80GB HBM3",
    capability=(9, 0),
    num_sms=132,
    l2_bytes=50 * 2**20,
    smem_per_sm=228 * 1024,
    regs_per_sm=65536,
    max_warps_per_sm=64,
    peak_tflops={"bfloat16": 989.4, "float16": 989.4, "float32": 494.7},
    dram_tbps=3.0,
)


def check_kernel(kernel: str, kernels: tuple[str, ...] = KERNELS, refused: dict | None = None, tool: str = "") -> None:
    """ValueError unless `kernel` is one of `kernels` (a tool's): for a rung in `refused` (default
    SPLITS_K), why `tool` does not take it."""
    refused = SPLITS_K if refused is None else refused
    if kernel in refused:
        raise ValueError(f"{tool}: kernel {kernel!r} {refused[kernel]}; expected one of {kernels}")
    if kernel not in kernels:
        raise ValueError(f"{tool}: unknown kernel {kernel!r}; expected one of {kernels}")


def ordering_of(kernel: str, scheduler: str = "grouped") -> str:
    """The `tile_order` ordering a kernel follows (`scheduler`: the persistent Gluon kernels' choice)."""
    check_kernel(kernel, tool="ordering_of")
    if scheduler not in ("grouped", "chunked"):
        raise ValueError(f"scheduler must be 'grouped' or 'chunked', but got {scheduler!r}")
    ordering = TILE_ORDERS[kernel]
    if ordering == SCHEDULED:
        return "chunked" if scheduler == "chunked" else "persistent"
    return ordering


def check_config(kernel: str, config: MatmulConfig) -> None:
    """ValueError for a tile `kernel` does not compute: rung 13's are odd widths."""
    if kernel == "odd_width" and not config.odd_width:
        raise ValueError(
            f"odd_width: BLOCK_N must be an odd width, the sum of two powers of two (96, 160, 192, ...), but got "
            f"BLOCK_N={config.BLOCK_N}"
        )


def default_config(kernel: str, dtype: str, M: int, N: int, K: int, gpu: GPU = H100) -> MatmulConfig:
    """The config `matmul(kernel=...)` picks on `gpu` (what a benchmark row labelled "default" ran):
    the dispatch's own answer, asked with `gpu`'s facts for a CUDA device's."""
    if kernel == "cublas":  # modelled with the Gluon kernels' tile choice
        return tiles.choose_config(M, N, gpu.num_sms)
    with device_info.modelled_gpu(gpu.device_name, gpu.capability, gpu.num_sms, gpu.l2_bytes):
        return dispatch.default_config(registry.get(kernel), getattr(torch, dtype), M, N, K, torch.device("cuda", 0))


def programs_per_sm(kernel: str, config: MatmulConfig, itemsize: int, gpu: GPU = H100) -> int:
    """Programs one SM holds at once, limited by shared memory, registers and warps (an estimate).

    Shared memory: `num_stages` A and B tiles (the ring). Registers: the fp32 accumulator spread
    over the program's threads plus ~64 for addresses and loop state, at most 255 per thread.
    Persistent kernels launch one program per SM whatever fits.
    """
    if kernel in PERSISTENT:
        return 1
    smem = config.num_stages * (config.BLOCK_M + config.BLOCK_N) * config.BLOCK_K * itemsize + 1024
    threads = config.num_warps * 32
    regs = threads * min(255, config.BLOCK_M * config.BLOCK_N // threads + 64)
    return max(1, min(gpu.smem_per_sm // smem, gpu.regs_per_sm // regs, gpu.max_warps_per_sm // config.num_warps))


@dataclass(frozen=True)
class Launch:
    """One GEMM launch of one kernel: who computes each tile, and which tiles run together."""

    kernel: str
    ordering: str
    M: int
    N: int
    config: MatmulConfig
    num_sms: int
    programs_per_sm: int
    schedule: tile_order.Schedule
    wave: np.ndarray  # (num_pid_m, num_pid_n): the wave each tile runs in

    @property
    def num_pid_m(self) -> int:
        return self.wave.shape[0]

    @property
    def num_pid_n(self) -> int:
        return self.wave.shape[1]

    @property
    def num_tiles(self) -> int:
        return self.wave.size

    @property
    def num_waves(self) -> int:
        return int(self.wave.max()) + 1

    @property
    def wave_size(self) -> int:
        """Programs in flight at once."""
        if self.ordering in ("persistent", "chunked"):
            return self.schedule.num_programs
        return self.num_sms * self.programs_per_sm

    def tiles_of_wave(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """(pid_m, pid_n) arrays of the tiles in wave w."""
        return np.nonzero(self.wave == w)

    def describe(self) -> str:
        c = self.config
        head = f"{self.kernel} ({self.ordering}"
        if self.ordering in ("grouped", "persistent"):
            head += f", GROUP_SIZE_M={c.GROUP_SIZE_M}"
        if self.kernel == "swap_ab":
            head += ", K whole: split_k=1"
        head += f") {self.M}x{self.N}, tiles {c.BLOCK_M}x{c.BLOCK_N}: {self.num_pid_m}x{self.num_pid_n} = "
        head += f"{self.num_tiles} tiles, "
        if self.ordering in ("persistent", "chunked"):
            return head + f"{self.schedule.num_programs} persistent programs, {self.num_waves} steps"
        return head + f"{self.num_sms} SMs x {self.programs_per_sm} programs/SM, {self.num_waves} waves"


def plan(
    kernel: str,
    M: int,
    N: int,
    config: MatmulConfig,
    *,
    num_sms: int = H100.num_sms,
    itemsize: int = 2,
    resident: int | None = None,
    gpu: GPU = H100,
) -> Launch:
    """The launch of `kernel` on an M x N output with `config` (`resident`: programs per SM, else estimated)."""
    if M < 1 or N < 1:
        raise ValueError(f"plan: M and N must be >= 1, but got M={M}, N={N}")
    ordering = ordering_of(kernel, config.scheduler)
    check_config(kernel, config)
    num_pid_m, num_pid_n = tile_order.cdiv(M, config.BLOCK_M), tile_order.cdiv(N, config.BLOCK_N)
    schedule = tile_order.schedule(ordering, num_pid_m, num_pid_n, config.GROUP_SIZE_M, num_programs=num_sms)
    per_sm = resident if resident is not None else programs_per_sm(kernel, config, itemsize, gpu)
    if ordering in ("persistent", "chunked"):
        wave = schedule.step
    else:
        wave = schedule.order // (num_sms * per_sm)
    return Launch(kernel, ordering, M, N, config, num_sms, per_sm, schedule, wave)
