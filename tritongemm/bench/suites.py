"""What the benchmark measures: named suites of problems (shape, dtype, layout) and, for the
tuning suites, the configurations to sweep."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from tritongemm.core.config import MatmulConfig
from tritongemm.core.registry import BATCH_INVARIANT

LAYOUTS = ("nn", "nt", "tn", "tt")  # n: operand stored as its shape says; t: a transposed view


@dataclass(frozen=True)
class Problem:
    M: int
    N: int
    K: int
    dtype: str  # "float16" | "bfloat16" | "float32"
    layout: str = "nn"  # a then b; "nt" = b is the transposed view of an (N, K) weight

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    @property
    def bytes(self) -> int:
        """a, b and c once each: the least a GEMM moves."""
        itemsize = getattr(torch, self.dtype).itemsize
        return (self.M * self.K + self.K * self.N + self.M * self.N) * itemsize

    def label(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    problems: tuple[Problem, ...]
    kernels: tuple[str, ...] | None = None  # None: every kernel available on the device
    # A sweep: every kernel runs each of these configs instead of its default config.
    configs: tuple[MatmulConfig, ...] = field(default=())


def problems(shapes, dtypes, layout: str = "nn") -> tuple[Problem, ...]:
    return tuple(Problem(M, N, K, dtype, layout) for (M, N, K), dtype in itertools.product(shapes, dtypes))


HALF = ("float16", "bfloat16")
K_SWEEP = (512, 1024, 2048, 4096, 8192, 16384)
LLM_TOKENS = (1, 16, 128, 2048, 8192)
# nn.Linear weights (out_features, in_features) of a Llama-3-8B layer: attention projection,
# MLP down projection (14336 -> 4096) and MLP up/gate projection (4096 -> 14336).
LLM_WEIGHTS = ((4096, 4096), (4096, 14336), (14336, 4096))
# Llama-3-70B's (N, K): attention's square projection and the MLP's up and down projections.
LLM_WEIGHTS_70B = ((8192, 8192), (28672, 8192), (8192, 28672))

# The tuning suites use the seed tables' problem, M = N = 8192, K = 16384, and Hopper's best tile.
SEED_PROBLEM = Problem(8192, 8192, 16384, "float16")
SEED_TILE = dict(BLOCK_M=128, BLOCK_N=256)


# The seeds' block/buffers/warps table: (BLOCK_K, stages) in (128, 2), (64, 3), (64, 4), 4 or 8 warps.
BLOCK_STAGE_WARP_CONFIGS = tuple(
    MatmulConfig(**SEED_TILE, BLOCK_K=bk, num_stages=stages, num_warps=warps)
    for (bk, stages), warps in itertools.product(((128, 2), (64, 3), (64, 4)), (4, 8))
)
# The seeds' scheduler table: GROUP_SIZE_M in 1, 2, 4, 6, 8 at 128x256x64, 8 warps, 3 stages.
GROUP_CONFIGS = tuple(
    MatmulConfig(**SEED_TILE, BLOCK_K=64, GROUP_SIZE_M=g, num_warps=8, num_stages=3) for g in (1, 2, 4, 6, 8)
)


# kernel="auto"'s targets (issue 14): decode to prefill token counts on both models' weights (NT,
# as nn.Linear stores them), the K sweep, squares, and odd shapes: a non-multiple of 8, primes, and
# rows TMA can't describe (12345 x 4567 x 2345: a K of 2345 halves is no 16-byte multiple).
AUTO_TOKENS = (1, 16, 64, 128, 512, 2048, 8192)
ODD_SHAPES = ((1000, 1000, 1000), (777, 4096, 4096), (3000, 5000, 1000), (5000, 3000, 7000), (997, 1009, 1013),
              (12345, 4567, 2345))  # fmt: skip
AUTO_SQUARE_AND_ODD = (
    [(8192, 8192, k) for k in K_SWEEP] + [(s, s, s) for s in (256, 1024, 4096, 8192)] + list(ODD_SHAPES)
)
# The same shapes with a transposed (tn) and with both transposed (tt): A as the transpose of a
# (K, M) tensor is what every weight gradient hands over (dW = dY^T X), and issue 25 found no suite
# had it (the TMA rungs copied such an A then: 0.55-0.65x cuBLAS).
AUTO_TRANSPOSED_PROBLEMS = problems(AUTO_SQUARE_AND_ODD, HALF, layout="tn") + problems(
    AUTO_SQUARE_AND_ODD, HALF, layout="tt"
)
AUTO_PROBLEMS = (
    problems([(m, n, k) for m in AUTO_TOKENS for n, k in LLM_WEIGHTS + LLM_WEIGHTS_70B], HALF, layout="nt")
    + problems(AUTO_SQUARE_AND_ODD, HALF)
    + AUTO_TRANSPOSED_PROBLEMS
)

# A training step's backward through y = x @ W.T (x (M, K) tokens, W (N, K) as nn.Linear stores
# it), as autograd hands the GEMMs over: dX = dY @ W, (M, N) @ (N, K), both row-major (nn), and
# dW = dY^T @ X, (N, M) @ (M, K), dY^T the transpose of the contiguous dY (tn). Llama-3-8B's and
# Qwen2-7B's layers, bf16 as models train.
QWEN2_7B_WEIGHTS = ((3584, 3584), (18944, 3584), (3584, 18944))
BACKWARD_TOKENS = (2048, 8192, 16384)
BACKWARD_PROBLEMS = tuple(
    problem
    for m in BACKWARD_TOKENS
    for n, k in LLM_WEIGHTS + QWEN2_7B_WEIGHTS
    for problem in (Problem(m, k, n, "bfloat16", "nn"), Problem(n, k, m, "bfloat16", "tn"))
)

# A decode step's GEMMs (issue 67): M = the sequences in flight, 1 to 256, on Llama-3-8B's layer
# weights (NT, as nn.Linear stores them), where each GEMM reads its whole weight for a few rows.
DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256)
# batch_invariant's suite: the M, decode to prefill.
INVARIANT_TOKENS = (1, 16, 64, 128, 512, 2048, 8192)

GROUPED_KERNELS = ("grouped", "persistent", "tma_persistent", "tma_persistent_pipelined")

SUITES = {
    s.name: s
    for s in (
        Suite(
            "ladder",
            "every rung x {fp16, bf16} on square, skinny and odd shapes",
            problems(
                [
                    (4096, 4096, 4096),
                    (8192, 8192, 8192),
                    (8192, 8192, 512),
                    (128, 4096, 4096),
                    (3000, 5000, 1000),
                    (2000, 1000, 2000),
                    (208, 416, 304),
                ],
                HALF,
            ),
        ),  # fmt: skip
        Suite(
            "ksweep",
            "M = N = 8192, K from 512 to 16384 (the seeds' K table)",
            problems([(8192, 8192, k) for k in K_SWEEP], HALF),
        ),  # fmt: skip
        Suite(
            "configs",
            "block / stages / warps sweep of one kernel at 8192 x 8192 x 16384 (the seeds' table)",
            (SEED_PROBLEM,),
            kernels=("tma_pipelined",),
            configs=BLOCK_STAGE_WARP_CONFIGS,
        ),
        Suite(
            "group",
            "GROUP_SIZE_M in 1, 2, 4, 6, 8 at 8192 x 8192 x 16384 (the seeds' scheduler table)",
            (SEED_PROBLEM,),
            kernels=GROUPED_KERNELS,
            configs=GROUP_CONFIGS,
        ),
        Suite(
            "llm",
            "transformer-layer GEMMs: tokens x nn.Linear weights (NT layout)",
            problems([(m, n, k) for m in LLM_TOKENS for n, k in LLM_WEIGHTS], HALF, layout="nt"),
        ),
        Suite(
            "decode-m",
            "kernel='auto' at every decode M from 1 to 256 on Llama-3-8B's layer weights (NT), fp16 and bf16",
            problems([(m, n, k) for m in DECODE_TOKENS for n, k in LLM_WEIGHTS], HALF, layout="nt"),
            kernels=("auto",),
        ),
        Suite(
            "invariant",
            "batch_invariant=True against kernel='auto' and cuBLAS on Llama-3-8B's layer weights (NT), M = 1 to 8192,"
            " fp16 and bf16",
            problems([(m, n, k) for m in INVARIANT_TOKENS for n, k in LLM_WEIGHTS], HALF, layout="nt"),
            kernels=("auto", BATCH_INVARIANT),
        ),
        Suite(
            "auto",
            "kernel='auto' on what users run: tokens x Llama-3-8B and -70B weights, the K sweep, squares, odd shapes"
            " (nn, and tn and tt)",
            AUTO_PROBLEMS,
            kernels=("auto",),
        ),
        Suite(
            "auto-transposed",
            "the auto suite's tn and tt rows alone (to re-measure them; scripts/ci/auto_targets.py merges)",
            AUTO_TRANSPOSED_PROBLEMS,
            kernels=("auto",),
        ),
        Suite(
            "backward",
            "kernel='auto' on a training step's dX (nn) and dW (tn) GEMMs of Llama-3-8B and Qwen2-7B layers, bf16",
            BACKWARD_PROBLEMS,
            kernels=("auto",),
        ),
    )
}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'M,N,K;M,N,K' -> [(M, N, K), ...]."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        dims = part.replace("x", ",").split(",")
        if len(dims) != 3 or not all(d.strip().isdigit() for d in dims):
            raise ValueError(f"--shapes: expected 'M,N,K' triples separated by ';', but got {part!r}")
        shapes.append(tuple(int(d) for d in dims))
    if not shapes:
        raise ValueError(f"--shapes: expected at least one 'M,N,K' triple, but got {text!r}")
    return shapes
