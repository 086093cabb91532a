"""What bounds the row-wise quantize-and-transpose kernel (issue 69): its arithmetic or its bytes.

kernel_probe.py measured the pair kernel at 1.0-1.7 TB/s where torch's bf16 -> e4m3 cast runs at
3.2 TB/s; without q's copy (one quotient a value) it reached 2.6 TB/s. Each value had cost an IEEE
division (div_rn) and a software round to fp8 per copy, the arithmetic the interpreter still
needs (fp8/tl.py's `_fp8_ready`). This times the kernel both ways on the GPU, by tile and warps:
  before  INTERPRETED=True: div_rn and the software round;
  after   the GPU's path: a reciprocal multiply with Markstein's correction, the hardware cast,
and counts the values each writes unlike torch's own `(x / scale).clamp(...).to(e4m3)`.

    PYTHONPATH=. python scripts/probes/fp8_training/cast_probe.py
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.testing import do_bench_cudagraph

from tritongemm.fp8 import pair_build
from tritongemm.fp8.recipes import fp8_cast_meta, fp8_max

E4M3 = torch.float8_e4m3fn
CONFIGS = tuple((r, c, w) for r, c in ((64, 64), (32, 128), (64, 128), (128, 64), (128, 128)) for w in (4, 8))


def data(R: int, C: int, seed: int) -> torch.Tensor:
    """bf16 values spread over many binades, rows and columns scaled apart."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(R, C, device="cuda", generator=g)
    rows = torch.randint(-12, 12, (R, 1), device="cuda", generator=g).float().exp2()
    cols = torch.randint(-6, 6, (1, C), device="cuda", generator=g).float().exp2()
    return (x * rows * cols).to(torch.bfloat16)


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for R, C in ((4096, 4096), (4096, 14336), (14336, 4096)):
        x = data(R, C, R + C)
        xf = x.float()
        rmax, cmax = xf.abs().amax(1), xf.abs().amax(0)
        # Divided by a tensor: torch's CUDA division by a Python number multiplies by its reciprocal
        # (recipes.reference_quantize), which made the first run's counts meaningless.
        fp8_max_t = rmax.new_tensor(448.0)
        s_ref, st_ref = rmax.clamp_min(1e-12) / fp8_max_t, cmax.clamp_min(1e-12) / fp8_max_t
        q_ref = (xf / s_ref[:, None]).clamp(-448, 448).to(E4M3)
        qt_ref = (xf / st_ref[None, :]).clamp(-448, 448).to(E4M3).T.contiguous()
        print(f"x ({R}, {C}): GB/s (4 bytes a value: bf16 read, two e4m3 writes) | values unlike torch's (q, qt)")
        rows = dict(scales=1, s=x.new_empty((R,), dtype=torch.float32), st=x.new_empty((C,), dtype=torch.float32),
                    rmax=rmax, cmax=cmax, q_ref=q_ref, qt_ref=qt_ref)  # fmt: skip
        # the tensor recipe: one scale, one cast, q and its transpose
        amax = rmax.amax().reshape(1)
        q_ref = (xf / (amax.clamp_min(1e-12) / fp8_max_t)).clamp(-448, 448).to(E4M3)
        st = x.new_empty((1,), dtype=torch.float32)
        whole = dict(scales=0, s=st, st=st, rmax=amax, cmax=amax, q_ref=q_ref, qt_ref=q_ref.T.contiguous())
        for label, case in (("", rows), ("tensor ", whole)):
            for br, bc, warps in CONFIGS:
                line = f"  {label}{br:3d} x {bc:3d} w{warps}:"
                for mode, name in enumerate(("before", "after")):
                    line += f" | {name} " + time_and_count(x, case, br, bc, warps, interpreted=mode == 0)
                print(line, flush=True)


def time_and_count(x, case: dict, br: int, bc: int, warps: int, interpreted: bool) -> str:
    """'GB/s (q's and qt's values unlike the reference's)' of the pair kernel on x, one way."""
    R, C = x.shape
    q, qt = x.new_empty((R, C), dtype=E4M3), x.new_empty((C, R), dtype=E4M3)
    meta = dict(SCALES=case["scales"], WRITE_Q=True, BLOCK_R=br, BLOCK_C=bc, FP8_MAX=fp8_max(E4M3), num_warps=warps)
    meta.update(fp8_cast_meta(E4M3), INTERPRETED=interpreted)  # before: the interpreter's arithmetic
    kernel = pair_build._quantize_pair_kernel[(triton.cdiv(R, br), triton.cdiv(C, bc))]
    run = functools.partial(kernel, x, q, qt, case["s"], case["st"], case["rmax"], case["cmax"], R, C, *x.stride(),
                            **meta)  # fmt: skip
    ms = do_bench_cudagraph(run, rep=50)
    bad_q = (q.view(torch.uint8) != case["q_ref"].view(torch.uint8)).sum().item()
    bad_qt = (qt.view(torch.uint8) != case["qt_ref"].view(torch.uint8)).sum().item()
    return f"{4 * R * C / ms / 1e6:5.0f} ({bad_q}, {bad_qt})"


if __name__ == "__main__":
    main()
