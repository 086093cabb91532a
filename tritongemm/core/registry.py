"""Every kernel the library has, of every family, as data: what it computes, on which dtypes and
GPUs, which idea it adds, and the module that holds it.

A family is the public function its kernels serve: `matmul` (the ladder's rungs, bottom to top),
`scaled_mm` and `quantize_fp8` (fp8), `grouped_mm`, the gated pair of a fused MLP, the
tensor-parallel GEMMs and a few kernels that models use around the GEMMs. `tritongemm.kernels()`
and `tritongemm kernels` list them all; `matmul(kernel=...)` takes a `matmul` kernel's name, and
the dispatch (tritongemm/dispatch/) chooses among each family's rows.

A row names its module and nothing of it is imported here: the modules import Triton, which
decides when a kernel is decorated whether it runs in its interpreter (TRITON_INTERPRET), so they
load when a plan is first built (`KernelInfo.plan`), not when tritongemm is imported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from tritongemm.core import device_info, tma

HALF = (torch.float16, torch.bfloat16)
HALF_AND_FP32 = (torch.float16, torch.bfloat16, torch.float32)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# Triton's interpreter (3.6 to 3.9) has no bf16: it computes a bf16 tl.dot on the raw bit
# patterns, relative error ~1e10. CPU tensors of that dtype are refused, never computed wrongly.
INTERPRETER_DTYPES = (torch.float16, torch.float32)


def plain_operands(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, out_dtype: torch.dtype):
    """The preparation of kernels without layout rules: operands as given, out or a new c."""
    if out is not None:
        return lambda a, b, out: (a, b, out)
    shape = (a.shape[0], b.shape[1])
    if out_dtype != a.dtype:
        return lambda a, b, out: (a, b, a.new_empty(shape, dtype=out_dtype))
    return lambda a, b, out: (a, b, a.new_empty(shape))  # 1 us less than torch.empty(shape, dtype=, device=)


@dataclass(frozen=True)
class KernelInfo:
    name: str  # what the family's `kernel=` takes (matmul's, scaled_mm's, the gated pair's), unique in its family
    family: str  # the public function it serves (FAMILIES)
    idea: str  # the idea it adds, in one line
    dtypes: tuple[torch.dtype, ...]  # operand dtypes it computes
    module: str  # where it lives: its kernel, and for `matmul`'s rungs `plan(a, b, c, config, ...)`
    rung: int | None = None  # `matmul`'s rungs: position on the ladder, each adding one idea to the one below
    interpretable: bool = False  # runs under TRITON_INTERPRET=1 on CPU tensors (`triton.language`)
    min_capability: tuple[int, int] = (9, 0)  # oldest CUDA compute capability it compiles for
    # Newest capability it runs on, for instructions a later architecture dropped (WGMMA: sm_90 only).
    max_capability: tuple[int, int] | None = None
    # Reads its operands through TMA: 16-byte aligned, a unit-stride last dimension (core/tma.py).
    # kernel="auto" passes operands that break this to a kernel that reads them in place, or, for a
    # problem large enough to repay it, gives this kernel aligned copies (dispatch.STAGING_MIN_FLOPS).
    tma: bool = False
    # Whether C may have another dtype than the operands (linear's out_dtype): the triton.language
    # kernels cast at the store; the Gluon ones size and type C's shared-memory tile by the operands'.
    any_out_dtype: bool = True
    # Not yet verified on a GPU, or verified but not yet faster than the rungs below it: kernel= by
    # name runs it; "auto", `tritongemm tune` and the benchmarks' default kernel lists leave it out.
    experimental: bool = False
    never_run_on: str = ""  # what `gpu` in describe() adds about capabilities it has never run on
    odd_widths: bool = False  # takes configs whose BLOCK_N is the sum of two powers of two
    recipes: tuple[str, ...] = ()  # `scaled_mm`'s: the scaling recipes it takes
    # Keyword arguments of its module's plan: rung 11 is rung 9's module with two consumers.
    options: tuple[tuple[str, object], ...] = ()

    def implementation(self):
        """Its module, imported on first use (see the module docstring)."""
        return importlib.import_module(self.module)

    def plan(self, a, b, c, config, **epilogue):
        """A `matmul` rung's plan(a, b, c, config, **epilogue) -> launch(a, b, c[, bias, residual,
        preact]): everything that depends only on the geometry (checks, grid, meta-parameters,
        compilation) done once, and a launcher for any tensors of that geometry."""
        return self.implementation().plan(a, b, c, config, **epilogue, **dict(self.options))

    def unsupported_reason(self, a: torch.Tensor, b: torch.Tensor) -> str | None:
        """Why this kernel can't take these operands as they are (None = it can): TMA's rules."""
        return tma.tma_unsupported_reason(a, b) if self.tma else None

    def aligned_copy_fits(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Whether the aligned copies `plan_operands` makes serve these operands (TMA kernels only)."""
        return self.tma and tma.aligned_copy_fits(a, b)

    def plan_operands(self, a, b, out, out_dtype):
        """`prepare(a, b, out) -> (a, b, c)`: what the launch gets, decided once per geometry. A
        kernel with layout rules prepares copies of the operands that break them, and a c of its
        own when it can't write to out, which `matmul` then copies into out."""
        return (tma.plan_operands if self.tma else plain_operands)(a, b, out, out_dtype)

    def available_on(self, device: torch.device) -> bool:
        return self.unavailable_reason(device) is None

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why this kernel does not run on `device` (None: it does), in words for a person."""
        device = torch.device(device)
        if device.type == "cpu":
            if not self.interpretable:
                return "Gluon kernel: needs a CUDA GPU (Gluon has no interpreter)"
            if not device_info.interpreter_active():
                return "CPU tensors run under the Triton interpreter only: set TRITON_INTERPRET=1 before importing"
            return None
        if device.type != "cuda":
            return f"runs on CUDA tensors, not on {device.type}"
        capability = device_info.capability(device)
        if not self.min_capability <= capability <= (self.max_capability or capability):
            return f"needs compute capability {self.capability_range()}, this GPU is {sm_name(capability)}"
        return None

    def dtypes_on(self, device: torch.device) -> tuple[torch.dtype, ...]:
        """The operand dtypes it computes correctly on `device`: on the CPU, the interpreter's."""
        if torch.device(device).type == "cpu":
            return tuple(d for d in self.dtypes if d in INTERPRETER_DTYPES)
        return self.dtypes

    def capability_range(self) -> str:
        low = sm_name(self.min_capability)
        if self.max_capability is None:
            return f"{low} or newer"
        return (
            f"{low} only" if self.max_capability == self.min_capability else f"{low} to {sm_name(self.max_capability)}"
        )

    def describe(self) -> dict:
        return {
            "name": self.name,
            "family": self.family,
            "rung": self.rung,
            "idea": self.idea,
            "dtypes": [dtype_name(d) for d in self.dtypes],
            "interpreter": self.interpretable,
            "interpreter_dtypes": [dtype_name(d) for d in self.dtypes if d in INTERPRETER_DTYPES]
            if self.interpretable
            else [],
            "gpu": self.capability_range() + (f" ({self.never_run_on})" if self.never_run_on else ""),
            "experimental": self.experimental,
            "module": self.module,
        }


def sm_name(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# What every row of a family shares, spelled once.
_LADDER_TL = dict(family="matmul", dtypes=HALF_AND_FP32, interpretable=True, min_capability=(8, 0))
_LADDER_GLUON = dict(
    family="matmul",
    dtypes=HALF,
    min_capability=(9, 0),  # TMA and WGMMA ...
    max_capability=(9, 0),  # ... and WGMMA is Hopper's alone: Blackwell has tcgen05 instead
    tma=True,
    any_out_dtype=False,  # C in the operands' dtype: the shared-memory plans are sized for it
)
# The rungs written against mma.py's interface alone: WGMMA on sm_90, tcgen05 on sm_100 and sm_103
# (Blackwell's datacenter parts; primitives/gluon/tcgen05.py: compiled for sm_100 in CI, never run).
_HOPPER_AND_BLACKWELL = dict(
    max_capability=(10, 3), never_run_on="compiled for sm_100, never run: no Blackwell GPU was available"
)
_RUNGS = "tritongemm.ladder."
_FP8_TL = dict(family="scaled_mm", dtypes=FP8, interpretable=True, min_capability=(8, 9), module="tritongemm.fp8.tl")
_FP8_GLUON = dict(family="scaled_mm", dtypes=FP8, max_capability=(9, 0))

# fmt: off
KERNELS: tuple[KernelInfo, ...] = (
    # matmul: the ladder
    KernelInfo("naive", rung=1, module=_RUNGS + "naive", **_LADDER_TL,
               idea="2D grid, one output tile per program, masks on M, N and K"),
    KernelInfo("grouped", rung=2, module=_RUNGS + "grouped", **_LADDER_TL,
               idea="1D grid in GROUP_SIZE_M-swizzled tile order, so programs in flight share A and B in L2"),
    KernelInfo("persistent", rung=3, module=_RUNGS + "persistent", **_LADDER_TL,
               idea="one program per SM looping over tiles in grouped order, with contiguity hints"),
    KernelInfo("tma_pipelined", rung=4, module=_RUNGS + "tma_pipelined", **_LADDER_GLUON,
               idea="TMA loads into a ring of smem buffers on mbarriers, async WGMMA, loads issued ahead"),
    KernelInfo("tma_persistent", rung=5, module=_RUNGS + "tma_persistent", **_LADDER_GLUON,
               idea="persistent programs over a tile scheduler, reusing barriers and MMA state"),
    KernelInfo("tma_persistent_pipelined", rung=6, module=_RUNGS + "tma_persistent_pipelined",
               **_LADDER_GLUON | _HOPPER_AND_BLACKWELL,
               idea="next tile's loads issued during this tile's drain; TMA store overlaps the next tile"),
    KernelInfo("split_k", rung=7, module=_RUNGS + "split_k", **_LADDER_GLUON,
               idea="K split over several programs per tile; fp32 partials summed in a fixed order by a second kernel"),
    KernelInfo("swap_ab", rung=8, module=_RUNGS + "swap_ab", **_LADDER_TL,
               idea="skinny problems: the weight's rows on the MMA's tall side (C.T = W @ x.T), K split to fill "
                    "the SMs"),
    KernelInfo("tma_warp_specialized", rung=9, module=_RUNGS + "tma_warp_specialized",
               experimental=True,  # right on the H100, not yet faster than rung 6 (docs/warp-specialization.md)
               **_LADDER_GLUON | _HOPPER_AND_BLACKWELL,
               idea="one warp only loads, the warpgroups only multiply; ready/empty barriers between them, "
                    "setmaxnreg"),
    KernelInfo("stream_k", rung=10, module=_RUNGS + "stream_k", experimental=True, **_LADDER_TL,
               idea="equal ranges of K-steps per program across tile boundaries; split tiles added in a fixed "
                    "order"),
    KernelInfo("tma_ping_pong", rung=11, module=_RUNGS + "tma_warp_specialized", options=(("consumers", 2),),
               experimental=True,  # right on the H100; auto takes it for short K only (dispatch.SHORT_K)
               **_LADDER_GLUON,
               idea="rung 9 with two consumer warpgroups on alternate tiles: one's epilogue under the other's "
                    "MMAs"),
    KernelInfo("split_tail", rung=12, module=_RUNGS + "split_tail",
               experimental=True,  # auto takes it for a few waves of 128 x 128 tiles (dispatch.AUTO_ORDER_SPLIT_TAIL)
               **_LADDER_GLUON,
               idea="whole waves of tiles as rung 6; the rows of a short last wave split along K as rung 7"),
    KernelInfo("odd_width", rung=13, module=_RUNGS + "odd_width", odd_widths=True,
               experimental=True,  # right on the H100; auto takes it for few waves only (dispatch.AUTO_ORDER_ODD_WIDTH)
               **_LADDER_GLUON,
               idea="rung 6 on tiles 160 or 192 wide, two accumulators side by side, so the tiles fill whole waves"),
    # scaled_mm and quantize_fp8: fp8 operands with their scales (fp8/)
    KernelInfo("fp8_grouped", **_FP8_TL, recipes=("tensor", "row", "block"),
               idea="rung 2 on fp8 operands, each K step's product scaled (per recipe) before it is summed"),
    KernelInfo("fp8_swap_ab", **_FP8_TL, recipes=("tensor", "row", "block"),
               idea="fp8_grouped computing C.T's tiles: the tokens on the MMA's narrow side, for decode sizes"),
    KernelInfo("fp8_tma", module="tritongemm.fp8.tma", **_FP8_GLUON, recipes=("tensor", "row", "block"),
               idea="rung 4 on fp8 operands: TMA ring, WGMMA on 32-deep fp8 steps, the scales in the epilogue"),
    KernelInfo("fp8_ws", module="tritongemm.fp8.ws", **_FP8_GLUON, recipes=("tensor", "row"),
               idea="rung 9 on fp8 operands: a loading warp, two MMA warpgroups, persistent over tiles"),
    KernelInfo("fp8_block", module="tritongemm.fp8.block", **_FP8_GLUON, recipes=("block",),
               idea="fp8_ws with DeepSeek-V3's block scales: each 128-deep K block promoted to fp32 and scaled"),
    KernelInfo("fp8_odd_width", module="tritongemm.fp8.odd_width", **_FP8_GLUON, recipes=("tensor", "row"),
               idea="rung 13's 96- to 192-wide tiles on fp8 operands, for decode sizes whose tiles would leave SMs "
                    "idle"),
    KernelInfo("quantize_fp8", family="quantize_fp8", module="tritongemm.fp8.tl", dtypes=HALF_AND_FP32,
               interpretable=True, min_capability=(8, 9),
               idea="each group's absmax, its scale and the cast to fp8 in one pass (a tensor's absmax first)"),
    # grouped_mm: ragged groups of rows (MoE experts) or of K (their weight gradients)
    KernelInfo("grouped_mm_rows", family="grouped_mm", module="tritongemm.grouped.tl", dtypes=HALF_AND_FP32,
               interpretable=True, min_capability=(8, 0),
               idea="persistent programs over every group's tiles, numbered on from the groups before; "
                    "optional gated pair"),
    KernelInfo("grouped_mm_k", family="grouped_mm", module="tritongemm.grouped.tl", dtypes=HALF_AND_FP32,
               interpretable=True, min_capability=(8, 0),
               idea="one tile grid per group of K: a weight gradient's per-expert products"),
    KernelInfo("grouped_mm_ws", family="grouped_mm", module="tritongemm.grouped.ws", dtypes=HALF,
               max_capability=(9, 0), tma=True,
               idea="rung 9 over row groups: the loading warp reads each group's rows, masked where groups end"),
    KernelInfo("grouped_mm_k_ws", family="grouped_mm", module="tritongemm.grouped.k_ws", dtypes=HALF,
               max_capability=(9, 0), tma=True,
               idea="rung 9 over K groups, for the weight gradient's layouts"),
    # the gated pair: act(x @ gate.T) * (x @ up.T) in one GEMM (blocks/gated_pair.py)
    KernelInfo("tma_persistent_pipelined", family="gated_pair", module=_RUNGS + "tma_persistent_pipelined", dtypes=HALF,
               max_capability=(9, 0), tma=True,
               idea="rung 6 on [gate; up]'s interleaved tiles, the gating in the epilogue: C half the MMA's width"),
    KernelInfo("tma_warp_specialized", family="gated_pair", module=_RUNGS + "tma_warp_specialized", dtypes=HALF,
               max_capability=(9, 0), tma=True,
               idea="rung 9 on [gate; up]'s interleaved tiles, the gating in the epilogue"),
    KernelInfo("grouped_mm_rows", family="gated_pair", module="tritongemm.grouped.tl", dtypes=HALF_AND_FP32,
               interpretable=True, min_capability=(8, 0),
               idea="grouped_mm's row-group kernel over one group: decode's pair on narrow tiles, any GPU"),
    # the tensor-parallel GEMMs (distributed/)
    KernelInfo("all_gather_matmul", family="distributed", module="tritongemm.distributed.gathered", dtypes=HALF,
               max_capability=(9, 0), tma=True,
               idea="rung 6 over the gathered rows in the order they land, each tile waiting on its piece's flag"),
    KernelInfo("reduce_partials", family="distributed", module="tritongemm.distributed.reduce", dtypes=HALF_AND_FP32,
               interpretable=True, min_capability=(8, 0),
               idea="the ranks' partial products summed in a fixed order, with linear's epilogue"),
    # around the GEMMs in a model
    KernelInfo("moe_combine", family="moe", module="tritongemm.grouped.tl", dtypes=HALF_AND_FP32,
               interpretable=True, min_capability=(8, 0),
               idea="a MoE layer's weighted un-permute: each token's top-k expert rows summed in fp32"),
    KernelInfo("moe_decode", family="moe", module="tritongemm.grouped.tl", dtypes=HALF, min_capability=(8, 0),
               idea="a decode step's experts in two launches: each token's gate/up and down rows, no sort"),
    KernelInfo("rms_norm", family="norm", module="tritongemm.blocks.rms_norm_kernels", dtypes=HALF_AND_FP32,
               interpretable=True, min_capability=(8, 0),
               idea="RMSNorm a row a program, optionally quantizing its output to fp8 for the next GEMM"),
    KernelInfo("glu", family="gated_pair", module="tritongemm.primitives.glu", dtypes=HALF_AND_FP32,
               interpretable=True, min_capability=(8, 0),
               idea="act(g) * u from a stored pair [g | u], and its backward, for training"),
)
# fmt: on
FAMILIES = tuple(dict.fromkeys(k.family for k in KERNELS))
# Where every rule of matmul's kernel="auto" ends: rung 1 takes any operands its device runs.
AUTO_FALLBACK = "naive"
# What `kernel=` is set to by batch_invariant=True: "auto" restricted to plans whose sum over K is
# the same for a row whatever M is (dispatch/invariant.py). A policy like "auto", not a kernel.
BATCH_INVARIANT = "auto:batch_invariant"
POLICIES = ("auto", BATCH_INVARIANT)
_BY_KEY = {(k.family, k.name): k for k in KERNELS}
assert len(_BY_KEY) == len(KERNELS), "a family's kernel names are unique"
# What gated_pair's kernel= names; the family's other rows (grouped_mm_rows, glu) are pieces its
# rules choose (decode's narrow pair, training's gating), not a kernel= choice.
GATED_RUNGS = ("tma_persistent_pipelined", "tma_warp_specialized")
assert all(("gated_pair", name) in _BY_KEY for name in GATED_RUNGS)


def all_kernels(family: str | None = None) -> list[KernelInfo]:
    """Every row, or a family's; `matmul`'s in ladder order."""
    rows = [k for k in _BY_KEY.values() if family is None or k.family == family]
    return sorted(rows, key=lambda k: (FAMILIES.index(k.family), k.rung or 0))


def get(name: str, family: str = "matmul") -> KernelInfo:
    """The row `name` of `family` (what `kernel=` takes), else a ValueError naming the choices."""
    info = _BY_KEY.get((family, name))
    if info is None:
        names = [k.name for k in all_kernels(family)]
        others = [k.family for k in KERNELS if k.name == name]
        other = f" ({name!r} is a {others[0]} kernel)" if others else ""
        raise ValueError(f"{family}: unknown kernel {name!r}{other}; expected 'auto' or one of {names}")
    return info


def kernels(device: torch.device | str | None = None, family: str | None = None) -> list[dict]:
    """Every kernel, family by family (`matmul`'s ladder bottom to top): its name, family, idea,
    dtypes, needs and module, and whether it runs on `device` (default: the current CUDA device,
    else the CPU), with the reason when it does not."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    return [
        info.describe() | {"available": info.available_on(device), "unavailable": info.unavailable_reason(device)}
        for info in all_kernels(family)
    ]
