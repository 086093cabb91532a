"""What B's copy into rows of whole 128-byte lines costs and buys (tma.PAD_B_MIN_M).

First the copy alone: torch's copy_ on the operand's own elements against
tma._row_aligned_copy, which moves the same bytes as 8-byte elements. Then kernel="auto"
on odd shapes with B's copy never taken (PAD_B_MIN_M = 10**9) and always (1), the copy inside the
timed call: kernel-only (CUDA graphs), medians, cuBLAS in the same run, each result checked
against the fp64 product. On a GPU: PYTHONPATH=. python3 scripts/probes/dense/probe_row_copy.py
(results/h100/probes/dense/row-copy.txt).
"""

import functools

import torch
import triton
from triton.testing import do_bench, do_bench_cudagraph

import tritongemm
from tritongemm.core import tma

COPIES = ((7000, 3000), (1000, 5000), (2345, 4568))  # B's (K, N): rows of 6,000, 10,000, 9,136 bytes
SHAPES = ((5000, 3000, 7000), (3000, 5000, 1000), (2048, 5000, 1000), (1536, 5000, 2000))


def time_copies() -> None:
    for rows, cols in COPIES:
        source = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
        target = torch.empty(rows, -(-cols // 64) * 64, device="cuda", dtype=torch.float16)[:, :cols]
        assert torch.equal(tma._row_aligned_copy(source, 128), source)
        plain = do_bench(functools.partial(target.copy_, source), warmup=25, rep=200, return_mode="median")
        wide = do_bench(functools.partial(tma._row_aligned_copy, source, 128), warmup=25, rep=200,
                        return_mode="median")  # fmt: skip
        moved = 2 * source.numel() * source.element_size()
        print(
            f"copy {rows} x {cols} fp16 into rows of whole 128-byte lines: copy_ as fp16 {plain * 1e3:5.1f} us "
            f"({moved / plain / 1e9:.2f} TB/s), _row_aligned_copy {wide * 1e3:5.1f} us ({moved / wide / 1e9:.2f} TB/s)",
            flush=True,
        )


def time_gemms(dtype: torch.dtype) -> None:
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(K, N, device="cuda", dtype=dtype)
        reference = a.double() @ b.double()
        cublas = do_bench_cudagraph(functools.partial(torch.matmul, a, b), rep=100, return_mode="median")
        timed = []
        for threshold in (10**9, 1):
            tma.PAD_B_MIN_M = threshold
            tritongemm.plans.clear()  # the copy is decided when a plan is built
            error = ((tritongemm.matmul(a, b).double() - reference).norm() / reference.norm()).item()
            ms = do_bench_cudagraph(functools.partial(tritongemm.matmul, a, b), rep=100, return_mode="median")
            timed.append(f"{ms * 1e3:6.1f} us {cublas / ms:.3f}x (rel err {error:.1e})")
        print(f"{str(dtype)[6:]:8s} {M} x {N} x {K}: cuBLAS {cublas * 1e3:6.1f} us; auto without B's copy "
              f"{timed[0]}, with it {timed[1]}", flush=True)  # fmt: skip


if __name__ == "__main__":
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    torch.manual_seed(0)
    saved = tma.PAD_B_MIN_M
    time_copies()
    for dtype in (torch.float16, torch.bfloat16):
        time_gemms(dtype)
    tma.PAD_B_MIN_M = saved
