"""Is the quantize-and-transpose kernel exact on the GPU (issue 69): every byte of q and qt against
`recipes.reference_quantize`, per recipe, input dtype, shape and tile, with the kernel's old
arithmetic (INTERPRETED=True: div_rn and the software round) and its GPU path (fp8/tl.py's
`_fp8_ready`), with q written (WRITE_Q) and without. The GPU tests had failed for fp32 x in the
block recipe; this told which variant was wrong (results/h200/probes/fp8_training/).

    PYTHONPATH=. python scripts/probes/fp8_training/pair_exactness_probe.py
"""

from __future__ import annotations

import torch
import triton

from tritongemm.fp8 import pair_build
from tritongemm.fp8.recipes import fp8_cast_meta, reference_quantize

E4M3 = torch.float8_e4m3fn
TILES = {"block": [(128, 128, 8)], "tensor": [(128, 64, 4), (64, 64, 8), (32, 128, 4)],
         "row": [(128, 64, 4), (64, 64, 8), (32, 128, 4)]}  # fmt: skip


def mismatches(got: torch.Tensor, want: torch.Tensor) -> int:
    return (got.view(torch.uint8) != want.view(torch.uint8)).sum().item()


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for dtype in (torch.float32, torch.bfloat16):
        for R, C in ((128, 128), (256, 384), (4096, 4096)):
            gen = torch.Generator().manual_seed(0)
            x = (torch.randn(R, C, generator=gen) * 3).to(dtype).cuda()
            x[R // 2, C // 3] = 500.0
            for recipe, scales in (("tensor", 0), ("block", 2), ("row", 1)):
                block = (128, 128) if recipe == "block" else None
                rq, rs = reference_quantize(x, recipe, block)
                rqt, rst = reference_quantize(x.T.contiguous(), recipe, block)
                xf = x.float()
                if recipe == "tensor":
                    rmax = cmax = xf.abs().amax().reshape(1)
                else:
                    rmax, cmax = xf.abs().amax(1).contiguous(), xf.abs().amax(0).contiguous()
                line = f"{str(dtype)[6:]:8s} {R}x{C} {recipe:6s}"
                for br, bc, warps in TILES[recipe]:
                    for interpreted in (True, False):
                        for write_q in (True, False):
                            q = torch.zeros(R, C, dtype=E4M3, device="cuda")
                            qt = torch.zeros(C, R, dtype=E4M3, device="cuda")
                            s, st = torch.zeros(rs.shape, device="cuda"), torch.zeros(rst.shape, device="cuda")
                            meta = dict(SCALES=scales, WRITE_Q=write_q, BLOCK_R=br, BLOCK_C=bc, FP8_MAX=448.0,
                                        num_warps=warps)  # fmt: skip
                            meta.update(fp8_cast_meta(E4M3), INTERPRETED=interpreted)
                            grid = (triton.cdiv(R, br), triton.cdiv(C, bc))
                            pair_build._quantize_pair_kernel[grid](
                                x, q if write_q else qt, qt, s if write_q else st, st, rmax, cmax, R, C, *x.stride(),
                                **meta,
                            )  # fmt: skip
                            torch.cuda.synchronize()
                            q_bad = mismatches(q, rq) if write_q else "-"
                            label = f"{br}x{bc}w{warps} {'old' if interpreted else 'new'} wq{int(write_q)}"
                            line += f" | {label}: q {q_bad} qt {mismatches(qt, rqt)}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
