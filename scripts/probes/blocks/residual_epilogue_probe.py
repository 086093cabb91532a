"""`tritongemm.linear(x, w, residual=r)` against `F.linear(x, w) + r` at the decoder layers' residual
GEMMs (o_proj and down_proj of Llama-3-8B and Qwen2-7B, an N that ends inside a tile, a decode
size), bf16, kernel-only (CUDA graph replays, the two taking turns over ROUNDS rounds), each
checked against fp64 first. Not `bench epilogue`: that suite's residual case has a bias (these
layers have none) and compiles torch.compile's provider for every shape. Run it on two trees in
one device call to compare an epilogue change by its ratio to torch (the ratios, not the times,
compare across runs):

    PYTHONPATH=. python3 scripts/probes/blocks/residual_epilogue_probe.py
"""

import functools
import statistics

import torch
import torch.nn.functional as F

import tritongemm
from tritongemm.bench.measure import gpu_timer
from tritongemm.core.epilogue import reference_linear
from tritongemm.core.reference import rel_error, tolerance

SHAPES = [(2048, 4096, 4096), (2048, 4096, 14336), (8192, 4096, 14336), (2048, 3584, 18944), (2048, 4000, 4096),
          (128, 4096, 4096)]  # fmt: skip
ROUNDS = 3


def _unfused(x, w, r):
    return F.linear(x, w) + r


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    ratios = []
    for M, N, K in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) * K**-0.5
        r = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=gen)
        expected = reference_linear(x, w, residual=r, out_dtype=torch.float64)
        ours = functools.partial(tritongemm.linear, x, w, residual=r)
        theirs = functools.partial(_unfused, x, w, r)
        err = rel_error(ours(), expected)
        assert err <= 2 * tolerance(torch.bfloat16, K), (M, N, K, err)
        times = {"tritongemm": [], "torch": []}
        for _ in range(ROUNDS):
            times["tritongemm"].append(gpu_timer(ours, use_graph=True))
            times["torch"].append(gpu_timer(theirs, use_graph=True))
        t_ours, t_torch = (statistics.median(times[k]) for k in ("tritongemm", "torch"))
        ratios.append(t_torch / t_ours)
        print(f"{M:>5} x {N:>5} x {K:>5}: ours {t_ours * 1e3:8.1f} us  torch {t_torch * 1e3:8.1f} us  "
              f"{t_torch / t_ours:.3f}x  err {err:.1e}", flush=True)  # fmt: skip
    print(f"geomean {statistics.geometric_mean(ratios):.3f}x")


if __name__ == "__main__":
    main()
