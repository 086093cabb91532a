"""Does fp8 training converge like bf16? (issue 69). A small Llama-shaped model learns bytes of
real text, the Python standard library's source files on this machine, for --steps steps in bf16
and with `tritongemm.patch(model, fp8_training=recipe)` per recipe: the same seed, the same
initial weights, the same batches in the same order, the same optimizer (AdamW on the bf16
parameters, warm-up then cosine decay). Writes, under --out-dir:

- convergence.csv: recipe, step, loss (training batch), ms (the step's wall clock);
- convergence-grads.csv: at step 0 (identical weights), every nn.Linear weight's gradient in each
  fp8 recipe against bf16's, relative Frobenius error;
- convergence-summary.csv: per recipe the mean loss of the final 50 steps, its ratio to bf16's,
  and the held-out loss (the last 5% of the text, never trained on);
- convergence.png: the loss curves.

    PYTHONPATH=. python scripts/fp8_training/convergence.py --steps 300 --out-dir results/h200/fp8-training
"""

from __future__ import annotations

import argparse
import csv
import math
import sysconfig
import time
from pathlib import Path

import torch

import tritongemm
from tritongemm.bench.environment import describe_environment
from tritongemm.tools import figures

RECIPES = ("bf16", "tensor", "row", "block")
# Widths that are multiples of 128 (block scales) and a vocabulary of bytes (256, also a multiple).
MODEL = dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=8, num_key_value_heads=8,
             num_hidden_layers=4,
             vocab_size=256, max_position_embeddings=1024, tie_word_embeddings=False, attention_dropout=0.0,
             attn_implementation="sdpa")  # fmt: skip
BATCH, SEQ = 16, 512
LR, WARMUP = 1e-3, 20
LAST = 50  # the steps whose mean loss is compared


def corpus(device) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) byte tensors: the stdlib's .py files, sorted by path, concatenated."""
    root = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join(p.read_bytes() for p in sorted(root.rglob("*.py")) if "site-packages" not in p.parts)
    text = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device=device, dtype=torch.long)
    cut = int(len(text) * 0.95)
    return text[:cut], text[cut:]


def batches(text: torch.Tensor, steps: int, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    starts = torch.randint(0, len(text) - SEQ - 1, (steps, BATCH), generator=gen)
    for row in starts:
        idx = row.to(text.device)[:, None] + torch.arange(SEQ, device=text.device)
        yield text[idx]


def build(recipe: str):
    import transformers

    torch.manual_seed(0)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**MODEL)).train()
    finally:
        torch.set_default_dtype(saved)
    if recipe != "bf16":
        tritongemm.patch(model, fp8_training=recipe)
        report = model.tritongemm_patch_report
        assert not report.skipped, report.skipped  # every nn.Linear in fp8, or the comparison is not one
    return model


def schedule(step: int, steps: int) -> float:
    if step < WARMUP:
        return (step + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, steps - WARMUP)))


def linear_grads(model) -> dict[str, torch.Tensor]:
    return {n: m.weight.grad.float().clone() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


@torch.no_grad()
def held_out_loss(model, text: torch.Tensor) -> float:
    model.eval()
    losses = []
    for batch in batches(text, 8, seed=1):
        losses.append(model(input_ids=batch, labels=batch, use_cache=False).loss.item())
    model.train()
    return sum(losses) / len(losses)


def run(recipe: str, steps: int, train: torch.Tensor, valid: torch.Tensor, bf16_grads: dict | None):
    model = build(recipe)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule(s, steps))
    losses, times, grads = [], [], None
    for step, batch in enumerate(batches(train, steps)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        if step == 0:
            grads = linear_grads(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        sched.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronizes
        times.append((time.perf_counter() - start) * 1e3)
        if not math.isfinite(losses[-1]):
            print(f"{recipe}: loss {losses[-1]} at step {step}: stopped")
            break
    errors = None
    if bf16_grads is not None:
        errors = {n: ((g - bf16_grads[n]).norm() / bf16_grads[n].norm()).item() for n, g in grads.items()}
    held = held_out_loss(model, valid)
    mean = sum(losses[-LAST:]) / len(losses[-LAST:])
    print(f"{recipe}: final {LAST}-step mean loss {mean:.4f}, held-out {held:.4f}, "
          f"median step {sorted(times)[len(times) // 2]:.1f} ms", flush=True)  # fmt: skip
    return losses, times, grads, errors, held


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--out-dir", default="results/h200/fp8-training")
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = describe_environment()
    print(env)
    train, valid = corpus("cuda")
    print(f"corpus: {len(train) + len(valid)} bytes of {sysconfig.get_paths()['stdlib']}/**/*.py")
    results, bf16_grads = {}, None
    for recipe in args.recipes.split(","):
        results[recipe] = run(recipe, args.steps, train, valid, bf16_grads)
        if recipe == "bf16":
            bf16_grads = results[recipe][2]
        torch.cuda.empty_cache()
    with (out / "convergence.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "triton", "recipe", "step", "loss", "ms"])
        for recipe, (losses, times, *_) in results.items():
            w.writerows([env["device"], env["triton"], recipe, i, f"{loss:.5f}", f"{t:.2f}"]
                        for i, (loss, t) in enumerate(zip(losses, times)))  # fmt: skip
    with (out / "convergence-grads.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["recipe", "module", "grad_rel_err_vs_bf16"])
        for recipe, (_, _, _, errors, _) in results.items():
            w.writerows([recipe, n, f"{e:.3e}"] for n, e in (errors or {}).items())
    base = results.get("bf16")
    base_mean = sum(base[0][-LAST:]) / LAST if base else None
    with (out / "convergence-summary.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "triton", "recipe", "steps", f"mean_loss_last_{LAST}", "ratio_to_bf16", "held_out_loss",
                    "median_step_ms", "max_grad_rel_err_step0"])  # fmt: skip
        for recipe, (losses, times, _, errors, held) in results.items():
            mean = sum(losses[-LAST:]) / len(losses[-LAST:])
            w.writerow([env["device"], env["triton"], recipe, len(losses), f"{mean:.5f}",
                        f"{mean / base_mean:.5f}" if base_mean else "", f"{held:.5f}",
                        f"{sorted(times)[len(times) // 2]:.2f}",
                        f"{max(errors.values()):.3e}" if errors else ""])  # fmt: skip
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for recipe, (losses, *_) in results.items():
        ax.plot(range(len(losses)), losses, label=recipe, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats per byte)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"4-layer Llama-shaped model on stdlib bytes, {BATCH} x {SEQ} tokens a step: bf16 vs fp8 training, "
                 f"{env['device']}", fontsize=8)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out / "convergence.png", dpi=120)
    print(f"wrote {out}/convergence*.csv, convergence.png")


if __name__ == "__main__":
    main()
