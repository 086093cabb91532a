"""The six GEMMs of a GatedMLP training step, each alone, as the module calls them (the same
operand views and layouts), `auto` against torch.matmul (cuBLAS) in the same run: which of them
keeps `bench mlp`'s forward+backward rows under torch's, and what `auto` picks there. bf16,
kernel-only (CUDA graph replay medians), Llama-3-8B's and Qwen2-7B's MLPs. On a GPU:

    PYTHONPATH=. python3 scripts/probes/blocks/mlp_gemms_probe.py [out.csv]
"""

import sys

import torch

import tritongemm
from tritongemm import dispatch
from tritongemm.bench.measure import gpu_timer
from tritongemm.bench.report import write_dicts
from tritongemm.core.reference import rel_error, tolerance

MLPS = {"llama-3-8b": (4096, 14336), "qwen2-7b": (3584, 18944)}  # hidden, intermediate
TOKENS = (2048, 8192)


def gemms(tokens: int, hidden: int, inter: int) -> dict:
    """name -> (a, b) as GatedMLP's forward and backward pass them to matmul / linear."""
    new = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    x, w_pair, w_down = new(tokens, hidden), new(2 * inter, hidden) / 64, new(hidden, inter) / 64
    h, dy, d_pair = new(tokens, inter), new(tokens, hidden), new(tokens, 2 * inter)
    return {
        "pair x @ Wgu^T (nt)": (x, w_pair.T),
        "down h @ Wd^T (nt)": (h, w_down.T),
        "down dgrad dy @ Wd (nn)": (dy, w_down),
        "down wgrad dy^T @ h (tn)": (dy.T, h),
        "pair dgrad d_pair @ Wgu (nn)": (d_pair, w_pair),
        "pair wgrad d_pair^T @ x (tn)": (d_pair.T, x),
    }


def main(path: str | None = None) -> None:
    rows = []
    for model, (hidden, inter) in MLPS.items():
        for tokens in TOKENS:
            totals = {"tritongemm": 0.0, "torch": 0.0}
            for name, (a, b) in gemms(tokens, hidden, inter).items():
                expected = a.double() @ b.double()
                times = {}
                for provider, fn in (("tritongemm", tritongemm.matmul), ("torch", torch.matmul)):
                    err = rel_error(fn(a, b), expected)
                    assert err <= tolerance(torch.bfloat16, a.shape[1]), (model, name, provider, err)
                    times[provider] = gpu_timer(lambda fn=fn, a=a, b=b: fn(a, b), use_graph=True)
                    totals[provider] += times[provider]
                M, K = a.shape
                choice = dispatch.explain(a, b).splitlines()[0].split(": ", 1)[1]
                ratio = times["torch"] / times["tritongemm"]
                tflops = 2 * M * b.shape[1] * K / times["tritongemm"] / 1e9
                ours_us, torch_us = times["tritongemm"] * 1e3, times["torch"] * 1e3
                print(f"{model:<11} {tokens:>5} {name:<30} {M:>6} x {b.shape[1]:>6} x {K:>6}  ours {ours_us:7.1f} us "
                      f"torch {torch_us:7.1f} us  {ratio:5.3f}x  {tflops:5.0f} TFLOP/s  {choice}")  # fmt: skip
                rows.append(dict(model=model, tokens=tokens, gemm=name, M=M, N=b.shape[1], K=K,
                                 ours_us=times["tritongemm"] * 1e3, torch_us=times["torch"] * 1e3,
                                 ratio_to_torch=ratio, auto=choice))  # fmt: skip
            print(f"{model:<11} {tokens:>5} all six: {totals['torch'] / totals['tritongemm']:.3f}x torch's")
    if path:
        write_dicts(path, rows)


if __name__ == "__main__":
    main(*sys.argv[1:2])
