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
`torch.compile` of the unfused block over the same GEMM total. Each GEMM alone multiplies the
block's own intermediate values, and the providers take turns over ROUNDS rounds. On a GPU:

    PYTHONPATH=. python3 scripts/probes/blocks/mlp_bound.py [out.csv]
"""

import functools
import statistics
import sys

import torch
import torch.nn.functional as F

from tritongemm.bench.measure import gpu_timer
from tritongemm.bench.mlp import MODELS, MlpProblem, _operands, _providers, _reference
from tritongemm.bench.report import write_dicts
from tritongemm.blocks.gated_pair import gated_pair
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.dense import linear as fused
from tritongemm.dense.matmul import matmul

TOKENS = (2048, 8192)
ROUNDS = 3  # each provider timed once a round, rounds interleaved: the board's clock drifts under its power cap


def intermediates(x, gate, up, down, training: bool) -> dict:
    """The block's own intermediate tensors (h, and for training dY as `bench mlp` passes it and
    the gradients that flow back), so that each GEMM alone multiplies the values it multiplies
    in the block: a GEMM's power draw, and so its clock under the cap, depends on its data."""
    g, u = x @ gate.T, x @ up.T
    t = dict(h=F.silu(g) * u)
    if training:
        t["dy"] = torch.ones_like(x)
        dh = t["dy"] @ down
        t["dg"], t["du"] = torch.ops.aten.silu_backward(dh * u, g), dh * F.silu(g)
        t["d_pair"] = torch.cat([t["dg"], t["du"]], dim=1)
    return t


def torch_gemms(x, gate, up, down, t: dict, training: bool):
    """The unfused block's GEMMs alone, on the operands autograd hands them."""
    pairs = [(x, gate.T), (x, up.T), (t["h"], down.T)]
    if training:  # dh; dW_down; dx from g and from u; dW_gate, dW_up
        dy, dg, du = t["dy"], t["dg"], t["du"]
        pairs += [(dy, down), (dy.T, t["h"]), (dg, gate), (du, up), (dg.T, x), (du.T, x)]
    return functools.partial(_each, torch.mm, pairs)


def our_gemms(x, gate, up, down, t: dict, training: bool):
    """GatedMLP's GEMMs alone: inference, the gated pair (its epilogue is the block's only
    elementwise work) and the down projection; training, the plain pair and its backward's."""
    weight = torch.cat([gate, up])
    if not training:
        return lambda: fused.linear(gated_pair(x, weight, "silu", "auto"), down)
    dy, d_pair = t["dy"], t["d_pair"]
    pairs = [(x, weight.T), (t["h"], down.T), (dy, down), (dy.T, t["h"]), (d_pair, weight), (d_pair.T, x)]
    return functools.partial(_each, matmul, pairs)


def _each(mm, pairs) -> None:
    for a, b in pairs:
        mm(a, b)


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
                inner = intermediates(*operands, training)
                fns = {name: calls[name] for name in ("torch", "torch.compile", "tritongemm")}
                fns["torch_gemms"] = torch_gemms(*operands, inner, training)
                fns["our_gemms"] = our_gemms(*operands, inner, training)
                samples = {name: [] for name in fns}
                for _ in range(ROUNDS):
                    for name, fn in fns.items():
                        samples[name].append(gpu_timer(fn, use_graph=True))
                t = {name: statistics.median(times) for name, times in samples.items()}
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
        write_dicts(path, rows)


if __name__ == "__main__":
    main(*sys.argv[1:2])
