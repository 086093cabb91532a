"""`tritongemm bench mlp`: a transformer's gated MLP block, `down(silu(gate(x)) * up(x))`, as
`tritongemm.blocks.GatedMLP` (two GEMMs: gate and up in one with act(g) * u in its epilogue)
against the unfused block a transformers model runs (three `F.linear`, a SiLU and a multiply:
five kernels) and `torch.compile` of that same function, in the same run.

Llama-3-8B's and Qwen2-7B's MLP dimensions at 1 to 8192 tokens, bf16, forward and
forward+backward (the input's and the three weights' gradients). Each provider is checked
against the fp64 block first (the forward's output; with the backward, the input's gradient); a
wrong one is reported and not timed. Timings as the other suites (measure.py): "graph" the GPU
work, "eager" a user's back-to-back calls. `ratio_to_torch` and `ratio_to_compile` are the
unfused block's and torch.compile's times over the provider's.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tritongemm.bench.measure import ROUNDS, TIMINGS, check_then_time
from tritongemm.bench.plots import plot_mlp
from tritongemm.bench.report import problems_here, run_suite
from tritongemm.blocks import GatedMLP
from tritongemm.core.reference import tolerance

# tritongemm-rung6 and -rung9: GatedMLP(kernel=...) with the gated pair on that rung's gated
# epilogue and the down projection on that rung (blocks/gated_pair.py); a GPU's rows only.
GATED_RUNGS = {"tritongemm-rung6": "tma_persistent_pipelined", "tritongemm-rung9": "tma_warp_specialized"}
PROVIDERS = ("torch", "torch.compile", "tritongemm", *GATED_RUNGS)
DIRECTIONS = ("forward", "forward+backward")
MODELS = {"llama-3-8b": (4096, 14336), "qwen2-7b": (3584, 18944)}  # hidden size, MLP width
TOKENS = (1, 16, 128, 2048, 8192)
COLUMNS = ["device", "dtype", "model", "tokens", "hidden", "intermediate", "direction", "provider", "timing", "ms",
           "ratio_to_torch", "ratio_to_compile"]  # fmt: skip


@dataclass(frozen=True)
class MlpProblem:
    model: str
    tokens: int
    hidden: int
    intermediate: int
    direction: str  # one of DIRECTIONS
    dtype: str = "bfloat16"

    @property
    def K(self) -> int:  # the deepest sum, for the tolerance
        return max(self.hidden, self.intermediate)

    @property
    def flops(self) -> int:
        forward = 2 * self.tokens * self.hidden * self.intermediate * 3
        return forward * (3 if self.direction == "forward+backward" else 1)

    @property
    def bytes(self) -> int:
        return 3 * self.hidden * self.intermediate * getattr(torch, self.dtype).itemsize

    def label(self) -> str:
        return f"{self.model} MLP {self.hidden}x{self.intermediate}, {self.tokens} tokens, {self.direction}"


SUITE = tuple(MlpProblem(m, t, h, i, d) for m, (h, i) in MODELS.items() for d in DIRECTIONS for t in TOKENS)
CPU_SMOKE = tuple(MlpProblem("tiny", 8, 32, 48, d, "float32") for d in DIRECTIONS)


@dataclass
class MlpRow:
    device: str
    dtype: str
    model: str
    tokens: int
    hidden: int
    intermediate: int
    direction: str
    provider: str
    timing: str
    ms: float | None
    ratio_to_torch: float | None
    ratio_to_compile: float | None
    max_rel_err: float | None
    status: str

    def as_dict(self) -> dict:
        return asdict(self)


def unfused_block(x, gate, up, down):
    """The block as transformers' LlamaMLP computes it."""
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def _operands(problem: MlpProblem, device):
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, problem.dtype)
    H, inner = problem.hidden, problem.intermediate
    x = torch.randn(problem.tokens, H, generator=gen).to(device=device, dtype=dtype)
    gate, up = (torch.randn(inner, H, generator=gen) * H**-0.5 for _ in range(2))
    down = torch.randn(H, inner, generator=gen) * inner**-0.5
    return x, *(w.to(device=device, dtype=dtype) for w in (gate, up, down))


def _providers(problem: MlpProblem, x, gate, up, down, on_gpu: bool) -> dict:
    """name -> fn(x) for the block, each over its own copy of the weights (gradients apart)."""
    training = problem.direction == "forward+backward"
    fused = GatedMLP(problem.hidden, problem.intermediate, "silu", device="meta")
    fused.gate_up_weight = torch.nn.Parameter(torch.cat([gate, up]), requires_grad=training)
    fused.down_proj.weight = torch.nn.Parameter(down.clone(), requires_grad=training)
    weights = [torch.nn.Parameter(w.clone(), requires_grad=training) for w in (gate, up, down)]
    blocks = {"torch": functools.partial(unfused_block, gate=weights[0], up=weights[1], down=weights[2])}
    if on_gpu:  # the interpreter smoke run has no compiler to time
        compiled = torch.compile(unfused_block, dynamic=False)
        blocks["torch.compile"] = functools.partial(compiled, gate=weights[0], up=weights[1], down=weights[2])
    blocks["tritongemm"] = fused
    params = {"torch": weights, "torch.compile": weights, "tritongemm": list(fused.parameters())}
    for name, kernel in GATED_RUNGS.items() if on_gpu else ():  # the same parameters, other kernels
        block = GatedMLP(problem.hidden, problem.intermediate, "silu", device="meta", kernel=kernel)
        block.gate_up_weight, block.down_proj.weight = fused.gate_up_weight, fused.down_proj.weight
        blocks[name], params[name] = block, params["tritongemm"]
    if not training:
        return {name: functools.partial(_forward, block, x) for name, block in blocks.items()}
    grad = torch.ones_like(x)
    return {name: functools.partial(_step, block, x, grad, params[name]) for name, block in blocks.items()}


def _forward(block, x):
    with torch.no_grad():
        return block(x)


def _step(block, x, grad, params):
    """One forward+backward; returns x's gradient (the check reads it)."""
    x = x.detach().requires_grad_()
    for p in params:
        p.grad = None
    block(x).backward(grad)
    return x.grad


def _reference(problem: MlpProblem, x, gate, up, down) -> torch.Tensor:
    x64, gate, up, down = (t.double() for t in (x, gate, up, down))
    if problem.direction == "forward":
        return unfused_block(x64, gate, up, down)
    x64.requires_grad_()
    unfused_block(x64, gate, up, down).backward(torch.ones_like(x64))
    return x64.grad


def measure_mlp(problem: MlpProblem, *, device, device_name: str, timings=TIMINGS, rounds: int = ROUNDS):
    operands = _operands(problem, device)
    calls = _providers(problem, *operands, on_gpu=device.type == "cuda")
    # Two GEMMs in a row (four with the backward), each on the last one's rounded output.
    bound = (2 if problem.direction == "forward" else 4) * tolerance(getattr(torch, problem.dtype), problem.K)
    errors, results = check_then_time(calls, _reference(problem, *operands), bound, problem, timings=timings,
                                      rounds=rounds)  # fmt: skip
    rows = []
    for timing, result in results.items():
        torch_ms, compile_ms = result["torch"][0], result.get("torch.compile", (None,))[0]
        for name, (ms, status) in result.items():
            to_torch = torch_ms / ms if torch_ms and ms else None
            to_compile = compile_ms / ms if compile_ms and ms else None
            rows.append(MlpRow(device_name, problem.dtype, problem.model, problem.tokens, problem.hidden,
                               problem.intermediate, problem.direction, name, timing, ms, to_torch, to_compile,
                               errors[name], status))  # fmt: skip
    return rows


def summary(rows: list[MlpRow]) -> list[str]:
    """The issue's bars, read from the rows: at M >= 2048 the fused forward against the unfused
    block (1.10x) and torch.compile (1.03x), forward+backward against the unfused (1.05x); at
    M <= 16, eager, against the unfused (1.3x)."""
    bars = (("forward", "graph", lambda t: t >= 2048, "ratio_to_torch", 1.10),
            ("forward", "graph", lambda t: t >= 2048, "ratio_to_compile", 1.03),
            ("forward+backward", "graph", lambda t: t >= 2048, "ratio_to_torch", 1.05),
            ("forward", "eager", lambda t: t <= 16, "ratio_to_torch", 1.3))  # fmt: skip
    lines = []
    for provider in PROVIDERS[2:]:
        for direction, timing, keep, column, bar in bars:
            ratios = [getattr(r, column) for r in rows if r.provider == provider and r.direction == direction
                      and r.timing == timing and keep(r.tokens) and getattr(r, column)]  # fmt: skip
            if ratios:
                lines.append(f"{provider:13s} {direction:16s} {timing:5s} {column}: lowest {min(ratios):.3f}, "
                             f"highest {max(ratios):.3f} (bar {bar}, {len(ratios)} rows)")  # fmt: skip
    return lines


def run_mlp(*, timings=TIMINGS, out_dir: str | Path | None = "results", name: str | None = None,
            rounds: int = ROUNDS) -> list[MlpRow]:  # fmt: skip
    """The SUITE on a GPU (a smoke run on tiny problems under the interpreter without one): prints
    the rows, writes `out_dir`/`name`.csv (COLUMNS, timed rows) and .json unless out_dir is None."""
    problems, base = problems_here(SUITE, CPU_SMOKE, name, "mlp")
    rows, env, paths = run_suite(problems, measure_mlp, name=base, out_dir=out_dir, columns=COLUMNS, timings=timings,
                                 rounds=rounds)  # fmt: skip
    for r in rows:
        ms = f"{r.ms:.4f}" if r.ms else "-"
        ratios = " ".join(f"{x:.3f}" if x else "-" for x in (r.ratio_to_torch, r.ratio_to_compile))
        print(f"{r.model:11s} {r.tokens:5d} {r.direction:16s} {r.provider:13s} {r.timing:5s} {ms:>9s} ms  "
              f"vs torch, compile {ratios}  {r.status}")  # fmt: skip
    print("\n".join(summary(rows)))
    if out_dir is not None and any(r.ratio_to_torch for r in rows):
        timed = [r for r in rows if r.ms is not None]
        paths += (plot_mlp(timed, Path(out_dir) / f"{base}.png", f"gated MLP block / torch's, {env['device']}"),)
    if paths:
        print("wrote " + ", ".join(str(p) for p in paths))
    return rows
