"""The RMSNorm alone (tritongemm/blocks/rms_norm.py) against transformers' eager LlamaRMSNorm and
torch.compile of it: forward, and forward + backward, bf16, at decode and prefill row counts of
Llama-3-8B's hidden size (and Qwen3's per-head q/k norm). Each checked against the fp64 formula
first, then timed kernel-only (forward: CUDA graph replay; forward + backward: do_bench, which
leaves autograd's host time between kernels) and eager (back-to-back calls, host included),
all in the same run. On a GPU, with transformers installed:

    PYTHONPATH=. python3 scripts/probes/blocks/rms_norm_probe.py [out.csv]
"""

import sys

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from tritongemm.bench.measure import eager_timer, gpu_timer
from tritongemm.bench.report import write_dicts
from tritongemm.blocks import RMSNorm
from tritongemm.blocks.rms_norm import rms_norm_reference
from tritongemm.core.reference import rel_error

CASES = [(1, 4096), (16, 4096), (2048, 4096), (8192, 4096), (2048 * 32, 128)]  # (rows, width)


def main(path: str | None = None) -> None:
    rows_out = []
    for rows, width in CASES:
        hf = LlamaRMSNorm(width, eps=1e-5).cuda().bfloat16()
        with torch.no_grad():
            hf.weight.copy_(torch.rand(width) + 0.5)
        ours = RMSNorm.from_norm(hf, 1e-5, 0.0, True)
        twin = LlamaRMSNorm(width, eps=1e-5).cuda().bfloat16()
        twin.load_state_dict(hf.state_dict())
        compiled = torch.compile(twin)
        providers = {"transformers": hf, "torch.compile": compiled, "tritongemm": ours}
        x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
        grad = torch.randn_like(x)
        expected = rms_norm_reference(x.double(), hf.weight.double(), 1e-5, 0.0, True)
        for direction in ("forward", "forward+backward"):
            times = {}
            for name, module in providers.items():
                leaf = x.detach().requires_grad_(direction != "forward")
                with torch.set_grad_enabled(direction != "forward"):
                    err = rel_error(module(leaf), expected)
                assert err < 1.6e-2, (name, rows, width, err)

                def step(module=module, leaf=leaf, direction=direction, grad=grad):
                    if direction == "forward":
                        with torch.no_grad():
                            module(leaf)
                    else:
                        torch.autograd.grad(module(leaf), (leaf, module.weight), grad)

                for _ in range(3):
                    step()
                graph = gpu_timer(step, use_graph=True) if direction == "forward" else gpu_timer(step, False)
                times[name] = (graph, eager_timer(step), err)
            for name, (graph, eager, err) in times.items():
                base_g, base_e = times["transformers"][:2]
                row = dict(rows=rows, width=width, direction=direction, provider=name, kernel_us=graph * 1e3,
                           eager_us=eager * 1e3, kernel_vs_transformers=base_g / graph,
                           eager_vs_transformers=base_e / eager, rel_err=err)  # fmt: skip
                rows_out.append(row)
                print(f"{rows:>6} x {width:<5} {direction:<17} {name:<13} kernel {graph * 1e3:8.1f} us "
                      f"({base_g / graph:5.2f}x)  eager {eager * 1e3:8.1f} us ({base_e / eager:5.2f}x)  "
                      f"err {err:.1e}")  # fmt: skip
    if path:
        write_dicts(path, rows_out)


if __name__ == "__main__":
    main(*sys.argv[1:2])
