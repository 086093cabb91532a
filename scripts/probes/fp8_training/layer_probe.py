"""fp8 training on one GPU, layer by layer (issue 69): for each recipe, Fp8TrainingLinear's step
(forward + backward) on a Llama-3-8B layer's projections at 4096 tokens against nn.Linear's bf16
step, eager and under torch.compile(fullgraph=True), with torch.utils.checkpoint too; then the
CUDA kernels of one eager fp8 step of the 4096 x 4096 -> 14336 projection, by GPU time (what the
quantization passes cost next to the GEMMs).

    PYTHONPATH=. python scripts/probes/fp8_training/layer_probe.py
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

from tritongemm.nn import Fp8TrainingLinear

TOKENS = 4096
SHAPES = [(4096, 14336), (14336, 4096), (4096, 4096)]  # (in, out): gate/up, down, o/q
RECIPES = ("tensor", "row", "block")


def step_fn(layer, x, dy):
    def step():
        layer.weight.grad = None
        x.grad = None
        layer(x).backward(dy)

    return step


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    import triton

    print(f"triton {triton.__version__}")
    for k, n in SHAPES:
        base = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16) * 1e-2
        flops = 3 * 2 * TOKENS * k * n
        ref = do_bench(step_fn(base, x, dy), warmup=50, rep=200)
        comp = torch.compile(base, fullgraph=True)
        ref_c = do_bench(step_fn(comp, x, dy), warmup=50, rep=200)
        x.grad = base.weight.grad = None  # do_bench's last step left its gradients
        base(x).backward(dy)
        gx, gw = x.grad.clone(), base.weight.grad.clone()
        line = f"{TOKENS}x{k}->{n}: bf16 {ref:.3f} ms ({flops / ref * 1e-9:.0f} TFLOP/s) compiled {ref_c:.3f}"
        for recipe in RECIPES:
            layer = Fp8TrainingLinear.from_linear(base, recipe)
            x.grad = None
            layer.weight.grad = None
            layer(x).backward(dy)
            errs = (rel(x.grad, gx), rel(layer.weight.grad, gw))
            t = do_bench(step_fn(layer, x, dy), warmup=50, rep=200)
            try:
                compiled = torch.compile(layer, fullgraph=True)
                x.grad = None
                layer.weight.grad = None
                compiled(x).backward(dy)
                cerr = (rel(x.grad, gx), rel(layer.weight.grad, gw))
                t_c = do_bench(step_fn(compiled, x, dy), warmup=50, rep=200)
                tc = f"{t_c:.3f} ms ({ref_c / t_c:.2f}x compiled bf16) errs {cerr[0]:.1e} {cerr[1]:.1e}"
            except Exception as exc:
                tc = f"compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            torch._dynamo.reset()
            line += (
                f"\n   {recipe:<6} eager {t:.3f} ms ({ref / t:.2f}x bf16, {flops / t * 1e-9:.0f} TFLOP/s) "
                f"errs dX {errs[0]:.1e} dW {errs[1]:.1e} | fullgraph {tc}"
            )
        print(line, flush=True)
        torch._dynamo.reset()

    # activation checkpointing around an fp8 layer
    base = torch.nn.Linear(4096, 4096, bias=True, device="cuda", dtype=torch.bfloat16)
    layer = Fp8TrainingLinear.from_linear(base, "row")
    x = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
    y.float().pow(2).sum().backward()
    g1 = x.grad.clone()
    x.grad = None
    layer.weight.grad = None
    layer(x).float().pow(2).sum().backward()
    print(f"checkpoint: dX equal to the plain step: {torch.equal(g1, x.grad)}")

    # what one eager fp8-row step of the gate/up projection spends its GPU time on
    base = torch.nn.Linear(4096, 14336, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(TOKENS, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(TOKENS, 14336, device="cuda", dtype=torch.bfloat16) * 1e-2
    for recipe in RECIPES:
        step = step_fn(Fp8TrainingLinear.from_linear(base, recipe), x, dy)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        print(f"--- {recipe}: kernels of 10 steps (4096 x 4096 -> 14336)")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
