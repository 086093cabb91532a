"""How a call's kernel and config are chosen, in one place: the kernel named, or for "auto" the
measured winner of the problem's bucket (dispatch/table.py, written by `tritongemm tune`), or
when no table answers, the rules below. `explain` says which applied and why, for
`tritongemm explain-choice`. Plans are built by dense/build.py, once per problem; nothing here runs
on a plan-cache hit.
"""

from __future__ import annotations

import torch

from tritongemm.core import checks, device_info, registry
from tritongemm.core.config import MatmulConfig
from tritongemm.core.registry import KernelInfo
from tritongemm.core.tma import rows_on_fast_boundaries
from tritongemm.dispatch import invariant, tiles
from tritongemm.dispatch import table as dispatch_table
from tritongemm.ladder import odd_width, split_tail, swap_ab
from tritongemm.primitives.gluon.pipeline import whole_c_config

# The rules: kernel="auto" takes the first of these that runs on the device, computes the dtype
# and accepts the operands as laid out (Gluon/TMA kernels refuse misaligned or non-unit-stride
# operands), or, for a large problem, takes them through an aligned copy (STAGING_MIN_FLOPS).
# Order from the committed H100 benchmarks (BENCHMARKS.md).
AUTO_ORDER = ("tma_persistent_pipelined", "persistent", "grouped", "naive")
# Skinny problems (up to 128 tokens against a weight) are memory-bound: W streamed once. On the
# H100 (fp16 and bf16, Llama-3-8B and -70B weights, kernel-only, results/h100/auto.csv) the rules'
# kernels before swap_ab ran 0.58-0.95x cuBLAS at M = 1 and 16 and 0.53-0.96x at M = 64 and 128;
# swap_ab 0.99-1.12x at M <= 16, 0.89-1.03x at 64 and 0.78-0.99x at 128 (bf16; docs/skinny.md).
SKINNY_M = 128
AUTO_ORDER_SKINNY = ("swap_ab", "grouped", "naive")
# Short K on a large C: a tile has at most 8 K-steps, so the epilogue is a large share of each
# tile's time, and rung 11's second consumer hides it under the other's MMAs (its default takes 6
# slots at this K). H100, 2026-11-23, same runs (results/h100/ksweep.csv, short-k.csv): 1.06-1.14x
# cuBLAS from 4096 x 4096 x 512 to 16384 x 8192 x 512 and at K = 256 and 384, where rung 6 ran
# 0.97-1.06x. Not where it lost: 2048 x 2048 x 512, a wave of rung 6's 128 x 256 tiles (0.98-0.99x
# against 0.99x), and 3000 x 5000 x 500, whose rows are not whole 128-byte lines (1.47x against
# rung 6's 1.73x: its 128 x 128 tiles read B twice as often). Hence two waves and whole lines.
SHORT_K = 512
AUTO_ORDER_SHORT_K = ("tma_ping_pong", *AUTO_ORDER)
# Few waves of a long K: where rung 6's tiles leave a quarter of the SMs' time idle in a part-empty
# last wave and rung 13's 160- or 192-wide tiles fill at most two waves (ladder/odd_width.py
# `pays`, with its H100 measurements: 0.84-0.98x cuBLAS where rung 6 ran 0.62-0.86x). With B
# row-major (nn) only its 192-wide tile: the 160-wide one lost there (0.64-0.76x at 512 and 1024 x
# 2560 x 8192, its 32-column tail's rows 64 bytes). Not where SMs are spared for other streams'
# kernels: bench tp's q,k,v chunks, which run side by side, lost on it (0.77x torch's fused op at
# 4096 tokens with the 192-wide tile, 0.62x with the 160, where rung 6 gives 0.98x; four H100s,
# results/h100x4/probes/tp-odd-width-*.csv).
AUTO_ORDER_ODD_WIDTH = ("odd_width", *AUTO_ORDER)
# A few waves of rung 6's 128 x 128 tiles and a fraction, from 1024 rows and a K of 4096: rung 12
# runs the rows of whole waves as rung 6 and splits the last, short wave's tiles along K
# (ladder/split_tail.py `pays`, with its H100 measurements: 0.81-0.94x cuBLAS where rung 6 ran
# 0.77-0.85x). Not where SMs are spared for other streams' kernels, as for the odd widths.
AUTO_ORDER_SPLIT_TAIL = ("split_tail", *AUTO_ORDER)
# Operands TMA can't read in place (a row stride that is not a multiple of 16 bytes, an offset
# pointer): on the H100, 12345 x 4567 x 2345 fp16, whose rows are 4690 and 9134 bytes, ran at
# 0.15x cuBLAS on the triton.language path and at 2.6-2.8x on the TMA kernels given aligned
# copies (issue 14; 3.3x since B's copy takes whole 128-byte lines). The copies cost host time
# too: each is an allocation and a launch, and with C's copy back three of them took 997 x 1009 x
# 1013 from 1.32-1.41x cuBLAS kernel-only to 0.25-0.44x eager. The grouped rung reads such
# operands where they lie at 1.04-1.14x kernel-only and 1.02-1.17x eager there, where the
# persistent one ran 0.41-0.46x (H100, 2026-11-23, results/h100/small-odd*.csv). Copying pays in
# eager time once the GEMM saves the copies' ~45 us: at the grouped rung's 85 TFLOP/s against the
# staged kernels' 400, from about 2**32 FLOPs. Below that, the grouped rung goes first.
STAGING_MIN_FLOPS = 2**32
AUTO_ORDER_UNALIGNED = ("grouped", "persistent", "naive")
TABLE = dispatch_table.TABLE  # how a table's choice's `why` begins


def choose(kernel: str, config, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, use_table: bool = True):
    """(KernelInfo, config, why) for a checked problem (core/checks.py `gemm`); config None means
    the kernel's default, and `why` starts with TABLE when a measured table chose."""
    if kernel == registry.BATCH_INVARIANT:
        return invariant.choose(a, b, out_dtype)
    if kernel != "auto":
        return registry.get(kernel), config, f"kernel={kernel!r} was asked for"
    if config is None and use_table:  # a config given with "auto" was meant for the rules' kernel
        choice = dispatch_table.lookup(a, b)
        if choice is not None and choice.kernel in {k.name for k in registry.all_kernels("matmul")}:
            info = registry.get(choice.kernel)
            # The table measured its winner on operands of this bucket, copies included if any.
            if cannot_take(info, a, b, out_dtype, copy_any_size=True) is None:
                return info, choice.config, choice.why
    order, rule = _rules_order(a, b, config)
    candidates = [registry.get(name) for name in order]
    passed = []
    for info in candidates:
        reason = cannot_take(info, a, b, out_dtype)
        if reason is None:
            skipped = "".join(f"; not {name}: {why}" for name, why in passed)
            if info.name == "odd_width":  # its tile depends on B's layout, which the registry's hook can't see
                config = _odd_width_tile(a, b, _sm_count(a.device))
            return info, config, f"the first of {rule} that takes the problem{skipped}"
        passed.append((info.name, reason))
    raise AssertionError(f"unreachable: checks.gemm found {registry.AUTO_FALLBACK!r} takes these operands")


# Each rung's default tile, by the rule the notes in dispatch/tiles.py (and the rung's module, for
# swap_ab's and the odd widths') give: what a call that names a kernel and no config runs.
_GLUON_RULES = {
    "tma_pipelined": lambda M, N, K, num_sms: tiles.choose_config(M, N, num_sms),
    "tma_persistent": lambda M, N, K, num_sms: tiles.choose_config(M, N, num_sms),
    "tma_persistent_pipelined": tiles.persistent_pipelined_config,
    "split_tail": tiles.persistent_pipelined_config,
    "tma_warp_specialized": tiles.warp_specialized_config,
    "tma_ping_pong": tiles.ping_pong_config,
    # for few output tiles: the smallest tile with rung 4's ring (split_k.ring_split_plan fills the SMs)
    "split_k": lambda M, N, K, num_sms: tiles.SMALL_TILE,
    # the tile for B row-major, which serves both layouts (`auto` passes the layout's own: _rules_order)
    "odd_width": lambda M, N, K, num_sms: odd_width.default_config(M, N, K, num_sms, b_k_major=False),
}


def default_config(info: KernelInfo, dtype: torch.dtype, M: int, N: int, K: int, device: torch.device) -> MatmulConfig:
    """The config `matmul(kernel=info.name)` runs without one given, on `device` (without a CUDA
    device, for tools and CPU tests: an H100's SMs for the Gluon rungs, the interpreter's tiles)."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    if info.name == "swap_ab":  # its own tiles: tokens x weight rows
        return swap_ab.default_config(dtype, M, N, K, device)
    rule = _GLUON_RULES.get(info.name)
    if rule is None:  # the `triton.language` rungs
        sms = device_info.sm_count(device) if on_gpu else device_info.INTERPRETER_SMS
        return tiles.ladder_config(dtype, M, N, K, num_sms=sms, interpret=not on_gpu)
    config = rule(M, N, K, device_info.sm_count(device) if on_gpu else tiles.H100_SMS)
    if on_gpu and device_info.capability(device)[0] == 10 and info.name in tiles.RULES:
        # On Blackwell (tcgen05) a ring cut until C's whole tile fits beside it: the rules were
        # measured on the H100, and tcgen05's epilogue can't store C in pieces.
        config = whole_c_config(config, dtype.itemsize)
    return config


def _rules_order(a: torch.Tensor, b: torch.Tensor, config=None) -> tuple[tuple[str, ...], str]:
    """The rules' kernels for this problem, in order, and how `explain` names the rule. A config
    given with "auto" was meant for rung 6's tiles: the few-wave rules, whose kernels pick tiles
    of their own (odd widths; a split tail), are not asked then."""
    M, K = a.shape
    if M <= SKINNY_M:
        return AUTO_ORDER_SKINNY, f"M <= {SKINNY_M}: {AUTO_ORDER_SKINNY}"
    if K <= SHORT_K and _short_k_pays(a, b, _sm_count(a.device)):
        rule = f"K <= {SHORT_K}, two waves of 128 x 256 tiles, rows of whole 128-byte lines: {AUTO_ORDER_SHORT_K}"
        return AUTO_ORDER_SHORT_K, rule
    if 2 * M * K * b.shape[1] < STAGING_MIN_FLOPS and _tma_would_copy(a, b):
        return AUTO_ORDER_UNALIGNED, f"rows TMA can't read, under {STAGING_MIN_FLOPS:.2g} FLOPs: {AUTO_ORDER_UNALIGNED}"
    if config is not None:
        return AUTO_ORDER, f"{AUTO_ORDER}"
    if _odd_width_tile(a, b, _sm_count(a.device)) is not None:
        rule = "at most two waves of 160- or 192-wide tiles where rung 6's leave a quarter of the SMs idle"
        return AUTO_ORDER_ODD_WIDTH, f"{rule}: {AUTO_ORDER_ODD_WIDTH}"
    if _split_tail_pays(a, b, _sm_count(a.device)):
        rule = "a few waves of 128 x 128 tiles and a short one, split along K"
        return AUTO_ORDER_SPLIT_TAIL, f"{rule}: {AUTO_ORDER_SPLIT_TAIL}"
    return AUTO_ORDER, f"{AUTO_ORDER}"


def _tma_would_copy(a: torch.Tensor, b: torch.Tensor) -> bool:
    """fp16/bf16 operands the TMA rungs take only through a copy (fp32 is not theirs at all)."""
    info = registry.get(AUTO_ORDER[0])
    return a.dtype in info.dtypes and b.dtype == a.dtype and info.unsupported_reason(a, b) is not None


def _sm_count(device: torch.device) -> int | None:
    return device_info.sm_count(device) if device.type == "cuda" else None


def _short_k_pays(a: torch.Tensor, b: torch.Tensor, num_sms: int | None) -> bool:
    if num_sms is None:  # no GPU: no rung 11
        return False
    waves = tiles.BIG_TILE.num_tiles(a.shape[0], b.shape[1]) / num_sms
    return waves >= 2 and rows_on_fast_boundaries(a, b)


def _waves_its_own(a: torch.Tensor, num_sms: int | None) -> bool:
    """Whether the few-wave rules may ask: a GPU, a Gluon dtype, A row-major (all they were measured
    on), and no SMs spared for other streams' kernels (the tensor-parallel ops' transfers and
    side-by-side chunk GEMMs), beside which a GEMM's tiles don't have the waves to themselves."""
    return (
        num_sms is not None
        and a.dtype in (torch.float16, torch.bfloat16)
        and a.stride(1) == 1
        and not device_info.spare_sms()
    )


def _odd_width_tile(a: torch.Tensor, b: torch.Tensor, num_sms: int | None) -> MatmulConfig | None:
    """Rung 13's tile where `auto` gives it the problem (odd_width.pays), else None."""
    if not _waves_its_own(a, num_sms):
        return None
    M, K = a.shape
    N = b.shape[1]
    b_k_major = b.stride(0) == 1 and b.stride(1) != 1
    if not odd_width.pays(M, N, K, num_sms, tiles.persistent_pipelined_config(M, N, K, num_sms), b_k_major):
        return None
    return odd_width.default_config(M, N, K, num_sms, b_k_major)


def _split_tail_pays(a: torch.Tensor, b: torch.Tensor, num_sms: int | None) -> bool:
    if not _waves_its_own(a, num_sms):
        return False
    M, K = a.shape
    N = b.shape[1]
    return split_tail.pays(M, N, K, num_sms, tiles.persistent_pipelined_config(M, N, K, num_sms))


def cannot_take(info, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, copy_any_size=False) -> str | None:
    """Why kernel="auto" can't give this problem to `info` (None: it can). `copy_any_size`: an
    aligned copy is fine whatever the problem's size (a table measured it)."""
    unavailable = info.unavailable_reason(a.device)
    if unavailable is not None:
        return unavailable
    if a.dtype not in info.dtypes_on(a.device):
        return f"no {str(a.dtype).removeprefix('torch.')} here"
    if out_dtype != a.dtype and not info.any_out_dtype:
        return "writes the inputs' dtype only"
    layout = info.unsupported_reason(a, b)
    if layout is None:
        return None
    if not info.aligned_copy_fits(a, b):
        return layout
    flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
    if flops < STAGING_MIN_FLOPS and not copy_any_size:
        return f"{layout}, and at {flops:.2g} FLOPs an aligned copy costs more than it saves"
    return None


def explain(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None, *,
            batch_invariant: bool = False) -> str:  # fmt: skip
    """What kernel="auto" (or batch_invariant=True) takes for a problem shaped and laid out like
    a @ b, and why (raising, as matmul would, where no kernel takes it)."""
    kernel = checks.invariant_kernel("auto", batch_invariant, "explain")
    checks.gemm(a, b, None, kernel, None)
    out_dtype = out_dtype or a.dtype
    info, config, why = choose(kernel, None, a, b, out_dtype)
    M, K = a.shape
    N = b.shape[1]
    config = config or default_config(info, a.dtype, M, N, K, a.device)
    shown = config.short() if isinstance(config, MatmulConfig) else config
    return f"{M} x {N} x {K} {str(a.dtype).removeprefix('torch.')} on {a.device}: {info.name}, {shown}\n  because {why}"
