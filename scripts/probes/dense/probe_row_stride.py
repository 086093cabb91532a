"""Does a row stride that is not a multiple of 128 bytes slow the TMA rungs? (BENCHMARKS.md,
"kernel='auto'": 5000 x 3000 x 7000 runs at 0.65-0.68x cuBLAS, 0.70x of what `tritongemm
predict` gives rung 6, while cuBLAS matches the model; its rows are 14,000 and 6,000 bytes.)

For each odd shape, the same problem with A, B and C laid out five ways, each timed on rungs 4
and 6 against cuBLAS on the contiguous operands, kernel-only (CUDA-graph replays, median), every
result checked first:
  - contiguous: rows of K * 2 and N * 2 bytes, as a user's tensors come;
  - rows padded to a multiple of 128 bytes (views into wider storage; TMA reads them in place);
  - rows padded to 256 bytes;
  - A's rows padded to 128 bytes, B and C as given; and B's alone (which operand costs).
Then the copies that would get there (A and B, and A alone, into 128-byte rows) are timed, and a control
shape whose every row is a multiple of 128 bytes (5120 x 3072 x 7168) runs contiguous.
If the padded rows close the gap and the copy costs less than it saves, an aligned copy for
these strides belongs in dispatch's staging rule.

Run on a GPU: PYTHONPATH=. python3 scripts/probes/dense/probe_row_stride.py [out.csv]
"""

import csv
import functools
import sys

import torch
import triton.testing

import tritongemm
from tritongemm.core.reference import rel_error, tolerance

SHAPES = ((5000, 3000, 7000), (3000, 5000, 1000), (777, 4096, 4096), (5120, 3072, 7168))
KERNELS = ("tma_persistent_pipelined", "tma_pipelined")
# The byte multiple of the row strides of A, B and C (0: contiguous).
ROW_BYTES = {
    "contiguous": (0, 0, 0),
    "rows of 128 B": (128, 128, 128),
    "rows of 256 B": (256, 256, 256),
    "A's rows of 128 B": (128, 0, 0),
    "B's rows of 128 B": (0, 128, 0),
}


def padded(rows: int, cols: int, dtype, multiple_bytes: int) -> torch.Tensor:
    """An uninitialized (rows, cols) view whose row stride is the next multiple of `multiple_bytes`."""
    if not multiple_bytes:
        return torch.empty(rows, cols, dtype=dtype, device="cuda")
    per = multiple_bytes // dtype.itemsize
    return torch.empty(rows, -(-cols // per) * per, dtype=dtype, device="cuda")[:, :cols]


def graph_ms(fn, *args, **kwargs) -> float:
    """Median ms of fn(*args, **kwargs) replayed in a CUDA graph."""
    return triton.testing.do_bench_cudagraph(functools.partial(fn, *args, **kwargs), rep=50, return_mode="median")


def copy_both(a, a0, b, b0) -> None:
    a.copy_(a0)
    b.copy_(b0)


def main(path: str) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["dtype", "m", "n", "k", "layout", "kernel", "ms", "tflops", "ratio_to_cublas", "rel_err"])
        for dtype in (torch.bfloat16, torch.float16):
            for M, N, K in SHAPES:
                a0 = torch.randn(M, K, device="cuda", dtype=dtype)
                b0 = torch.randn(K, N, device="cuda", dtype=dtype)
                ref = a0.double() @ b0.double()
                flops = 2 * M * N * K
                c0 = torch.empty(M, N, device="cuda", dtype=dtype)
                cublas = graph_ms(torch.matmul, a0, b0, out=c0)
                name = str(dtype).removeprefix("torch.")
                out.writerow([name, M, N, K, "contiguous", "cublas", cublas, flops / cublas / 1e9, 1.0, ""])
                for layout, (a_multiple, b_multiple, c_multiple) in ROW_BYTES.items():
                    a, b = padded(M, K, dtype, a_multiple), padded(K, N, dtype, b_multiple)
                    c = padded(M, N, dtype, c_multiple)
                    copy_both(a, a0, b, b0)
                    for kernel in KERNELS:
                        c.fill_(float("nan"))
                        tritongemm.matmul(a, b, out=c, kernel=kernel)
                        err = rel_error(c, ref)
                        ms = graph_ms(tritongemm.matmul, a, b, out=c, kernel=kernel)
                        ok = err <= tolerance(dtype, K)
                        out.writerow([name, M, N, K, layout, kernel, ms, flops / ms / 1e9, cublas / ms, err])
                        print(f"{name} {M}x{N}x{K} {layout:<14} {kernel:<25} {cublas / ms:.3f}x cuBLAS"
                              f"{'' if ok else '  WRONG'}", flush=True)  # fmt: skip
                a, b = padded(M, K, dtype, 128), padded(K, N, dtype, 128)
                copy = graph_ms(copy_both, a, a0, b, b0)
                out.writerow([name, M, N, K, "copy A and B to rows of 128 B", "torch copy_", copy, "", "", ""])
                print(f"{name} {M}x{N}x{K} copying A and B into 128-byte rows: {copy * 1e3:.1f} us", flush=True)
                copy_a = graph_ms(a.copy_, a0)
                out.writerow([name, M, N, K, "copy A to rows of 128 B", "torch copy_", copy_a, "", "", ""])
                print(f"{name} {M}x{N}x{K} copying A alone: {copy_a * 1e3:.1f} us", flush=True)
                f.flush()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe_row_stride.csv")
