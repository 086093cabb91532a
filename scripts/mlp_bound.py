"""What the gated MLP block's ratio to torch can reach while its GEMMs only match cuBLAS.

`bench mlp` times the block; this splits each side's block time into its GEMMs and the rest
(elementwise kernels, gaps between kernels), all kernel-only (CUDA graph replays) in one run:

    torch:      block = its GEMMs (3 forward, 9 with the backward, torch.mm on the autograd's
                operands) + the rest (SiLU, multiply, their backward, the sum of x's two grads)
    tritongemm: block = its GEMMs (2 forward, 6 with the backward, the gated pair's with its
                epilogue) + the rest (the pair's elementwise kernels when training)

and reports the block's measured ratio beside `parity`: torch's block time over ours with our
GEMMs replaced by torch's, torch_block / (torch_gemms + our_rest). That is the ratio fusion
buys on its own; above it, only faster GEMMs help. The forward row is an inference forward
(no_grad), forward+backward a training step's, as in `bench mlp`; `compile` is
`torch.compile` of the unfused block over the same GEMM total. On a GPU:

    PYTHONPATH=. python3 scripts/mlp_bound.py [out.csv]
"""

import csv
import sys

import torch

from tritongemm import fused
from tritongemm.api import matmul
from tritongemm.bench.measure import gpu_timer
from tritongemm.bench.mlp import MODELS, MlpProblem, _operands, _providers, _reference
from tritongemm.blocks.gated_pair import gated_pair
from tritongemm.reference import rel_error, tolerance

TOKENS = (2048, 8192)


def torch_gemms(x, gate, up, down, training: bool):
    """The unfused block's GEMMs alone, on operands of the same shapes and layouts."""
    h, dy = torch.empty_like(x @ gate.T), torch.randn_like(x)
    forward = [(x, gate.T), (x, up.T), (h, down.T)]
    backward = [(dy, down), (dy.T, h), (h, gate), (h, up), (h.T, x), (h.T, x)]  # dh; dWd; dx x2; dWg, dWu
    pairs = forward + (backward if training else [])

    def run():
        for a, b in pairs:
            torch.mm(a, b)

    return run


def our_gemms(x, gate, up, down, training: bool):
    """GatedMLP's GEMMs alone: inference, the gated pair (its epilogue is the block's only
    elementwise work) and the down projection; training, the plain pair and its backward's."""
    weight = torch.cat([gate, up])
    h, dy = torch.empty_like(x @ gate.T), torch.randn_like(x)
    d_pair = torch.randn_like(x @ weight.T)
    if not training:
        return lambda: fused.linear(gated_pair(x, weight, "silu", "auto"), down)
    pairs = [(x, weight.T), (h, down.T), (dy, down), (dy.T, h), (d_pair, weight), (d_pair.T, x)]

    def run():
        for a, b in pairs:
            matmul(a, b)

    return run


def main(path: str | None = None) -> None:
    device, rows = torch.device("cuda"), []
    for model, (hidden, inter) in MODELS.items():
        for tokens in TOKENS:
            for direction in ("forward", "forward+backward"):
                problem = MlpProblem(model, tokens, hidden, inter, direction)
                training = direction == "forward+backward"
                operands = _operands(problem, device)
                calls = _providers(problem, *operands, on_gpu=True)
                bound = (4 if training else 2) * tolerance(torch.bfloat16, problem.K)
                err = rel_error(calls["tritongemm"](), _reference(problem, *operands))
                assert err <= bound, f"{problem.label()}: tritongemm's error {err:.2e} > {bound:.2e}"
                t = {name: gpu_timer(calls[name], use_graph=True) for name in ("torch", "torch.compile", "tritongemm")}
                t["torch_gemms"] = gpu_timer(torch_gemms(*operands, training), use_graph=True)
                t["our_gemms"] = gpu_timer(our_gemms(*operands, training), use_graph=True)
                our_rest = t["tritongemm"] - t["our_gemms"]
                row = dict(model=model, tokens=tokens, direction=direction,
                           torch_ms=t["torch"], compile_ms=t["torch.compile"], ours_ms=t["tritongemm"],
                           torch_gemms_ms=t["torch_gemms"], our_gemms_ms=t["our_gemms"],
                           torch_rest_ms=t["torch"] - t["torch_gemms"], our_rest_ms=our_rest,
                           gemm_ratio=t["torch_gemms"] / t["our_gemms"], ratio=t["torch"] / t["tritongemm"],
                           parity=t["torch"] / (t["torch_gemms"] + our_rest),
                           ratio_to_compile=t["torch.compile"] / t["tritongemm"],
                           parity_to_compile=t["torch.compile"] / (t["torch_gemms"] + our_rest))  # fmt: skip
                rows.append(row)
                print(f"{model:<11} {tokens:>5} {direction:<16} torch {row['torch_ms']:.3f} ms "
                      f"(GEMMs {row['torch_gemms_ms']:.3f}, rest {row['torch_rest_ms']:.3f})  ours "
                      f"{row['ours_ms']:.3f} (GEMMs {row['our_gemms_ms']:.3f}, rest {our_rest:.3f})  GEMMs "
                      f"{row['gemm_ratio']:.3f}x  block {row['ratio']:.3f}x, at parity {row['parity']:.3f}x  vs "
                      f"compile {row['ratio_to_compile']:.3f}x, at parity {row['parity_to_compile']:.3f}x")  # fmt: skip
    if path:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main(*sys.argv[1:2])
