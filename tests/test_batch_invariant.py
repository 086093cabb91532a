"""batch_invariant=True: a row's result is the same bits in the full batch, alone, and in any
sub-batch. Under the interpreter on the CPU (the `tl` class: swap-AB below 129 rows, rung 2
above); on a GPU the same cases at M up to 8192 (on Hopper the Gluon class, whose tiles change
with M), and the class's kernels against each other."""

from __future__ import annotations

import importlib.util
import zlib
from dataclasses import dataclass

import pytest
import torch
from cases import DEVICE, ON_GPU, ON_HOPPER

import tritongemm
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.dispatch import invariant

DTYPES = (torch.bfloat16, torch.float16, torch.float32) if ON_GPU else (torch.float16, torch.float32)
# Batches either side of the class's boundaries: swap-AB's tokens tile (16, 64), SKINNY_M, and on
# the GPU rung 6's tiles changing with M (TINY to BIG).
MS = (1, 2, 7, 16, 17, 64, 65, 128, 129, 300) + ((256, 257, 1000, 2048, 4097, 8192) if ON_GPU else ())


@dataclass(frozen=True)
class Shape:
    N: int
    K: int
    layout: str = "nt"  # "nt": b is an (N, K) weight's transpose, as nn.Linear's; "nn": row-major

    def __str__(self) -> str:
        return f"{self.N}x{self.K}-{self.layout}"


# Odd N and K on purpose; on the GPU, a decode weight and a K long enough that `auto` splits it.
SHAPES = (Shape(96, 200), Shape(33, 77, "nn"), Shape(64, 520)) + (
    (Shape(4096, 4096), Shape(1000, 3000, "nn"), Shape(4096, 14336)) if ON_GPU else ()
)


def _operands(shape: Shape, M: int, dtype: torch.dtype, seed: str = ""):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}{M}{dtype}{seed}".encode()))
    a = torch.randn(M, shape.K, generator=gen).to(DEVICE, dtype)
    w = torch.randn(shape.N, shape.K, generator=gen).to(DEVICE, dtype)
    return a, (w.T if shape.layout == "nt" else w.T.contiguous())


def _sub_batches(M: int, seed: int) -> list[torch.Tensor]:
    """Row indices: each row alone (a sample of them past 8), slices at random offsets, and a
    random subset gathered out of order."""
    gen = torch.Generator().manual_seed(seed)
    alone = range(M) if M <= 8 else sorted({0, M - 1, *torch.randint(0, M, (6,), generator=gen).tolist()})
    picks = [torch.tensor([r]) for r in alone]
    for _ in range(3):
        size = int(torch.randint(1, M + 1, (1,), generator=gen))
        start = int(torch.randint(0, M - size + 1, (1,), generator=gen))
        picks.append(torch.arange(start, start + size))
    picks.append(torch.randperm(M, generator=gen)[: max(1, M // 3)])
    return picks


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def _assert_rows_invariant(compute, a: torch.Tensor, what: str) -> torch.Tensor:
    full = compute(a)
    for rows in _sub_batches(a.shape[0], a.shape[0]):
        part = compute(a[rows.to(a.device)])
        same = _bits(part) == _bits(full[rows.to(a.device)])  # bits, not values: -0 and +0 differ
        assert same.all(), f"{what}: rows {rows[:8].tolist()}... of {a.shape[0]} differ from the full batch's"
    return full


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("M", MS)
def test_matmul_rows_are_the_same_bits_in_any_batch(M, shape, dtype):
    a, b = _operands(shape, M, dtype)
    full = _assert_rows_invariant(lambda x: tritongemm.matmul(x, b, batch_invariant=True), a, f"{M} x {shape}")
    assert rel_error(full, a.double() @ b.double()) <= tolerance(dtype, shape.K)


@pytest.mark.parametrize("activation", (None, "gelu", "silu"))
@pytest.mark.parametrize("M", (1, 17, 129) + ((2048,) if ON_GPU else ()))
def test_linear_with_bias_and_activation_is_invariant(M, activation):
    dtype = DTYPES[0]
    x, wt = _operands(Shape(96, 200), M, dtype, "linear")
    weight, bias = wt.T, torch.randn(96, generator=torch.Generator().manual_seed(M)).to(DEVICE, dtype)
    full = _assert_rows_invariant(
        lambda v: tritongemm.linear(v, weight, bias, activation=activation, batch_invariant=True), x, "linear"
    )
    z = x.double() @ weight.double().T + bias.double()
    ref = {None: z, "gelu": torch.nn.functional.gelu(z), "silu": torch.nn.functional.silu(z)}[activation]
    assert rel_error(full, ref) <= tolerance(dtype, 200)


def test_the_default_auto_is_not_invariant_where_it_splits_k():
    """What the mode is for: `auto` splits a long K among programs for a single row (swap-AB fills
    the SMs), so the row alone is added up in another order than in a batch of 300."""
    a, b = _operands(Shape(32, 2048), 300, torch.float32, "auto")
    full, alone = tritongemm.matmul(a, b), tritongemm.matmul(a[:1], b)
    assert not torch.equal(alone, full[:1])
    assert torch.equal(tritongemm.matmul(a[:1], b, batch_invariant=True),
                       tritongemm.matmul(a, b, batch_invariant=True)[:1])  # fmt: skip


def test_the_plans_never_split_k():
    a, b = _operands(Shape(32, 2048), 1, torch.float32)
    info, config, why = invariant.choose(a, b, torch.float32)
    assert why.startswith("batch_invariant") and (info.name != "swap_ab" or config.split_k == 1)


# The Gluon class's decode rules on a 132-SM Hopper (what the H200 probe measured fastest).
@pytest.mark.parametrize(
    "M, N, K, kernel, tile",
    [
        (1, 4096, 4096, "swap_ab", "16x64x256"),
        (16, 14336, 4096, "swap_ab", "16x64x256"),
        (64, 4096, 4096, "tma_persistent_pipelined", "64x32x128"),
        (64, 14336, 4096, "tma_persistent_pipelined", "64x128x64"),
        (128, 4096, 14336, "tma_persistent_pipelined", "64x64x128"),
        (128, 14336, 4096, "tma_persistent_pipelined", "128x128x64"),
        (256, 4096, 4096, "tma_persistent_pipelined", "64x128x64"),
        (256, 14336, 4096, "tma_persistent_pipelined", "128x256x64"),
    ],
)
def test_the_decode_rules_pick_the_tile_that_fills_the_sms(M, N, K, kernel, tile):
    name, config = invariant.decode_config(M, N, K, 132)
    assert (name, config.short().split()[0]) == (kernel, tile)
    assert config.split_k in (0, 1) if name == "tma_persistent_pipelined" else config.split_k == 1


@pytest.mark.parametrize("K", (64, 77, 200, 520, 4096, 4160, 4224, 14336))
def test_every_member_of_the_gluon_class_steps_over_the_same_k(K):
    """A K-step past K adds zeros, which can turn a -0 sum into +0: whatever the tile, the steps
    must end at the same place, so BLOCK_K > 64 only where it divides K."""
    ends = set()
    for M in (1, 16, 17, 64, 65, 128, 129, 256, 257, 1000, 8192):
        for N in (96, 4096, 14336):
            name, config = invariant.decode_config(M, N, K, 132)
            assert config.BLOCK_K == 64 or K % config.BLOCK_K == 0, (M, N, config.short())
            steps = -(-K // config.BLOCK_K)
            if name == invariant.GLUON_CLASS:  # rung 6's prologue runs num_stages - 1 steps, K or not
                steps = max(steps, config.num_stages - 1)
            ends.add(steps * config.BLOCK_K)
    assert len(ends) == 1, ends


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(kernel="grouped"), ValueError, "kernel must be 'auto', but got 'grouped'"),
        (dict(batch_invariant=1), TypeError, "expected batch_invariant to be a bool"),
        (
            dict(
                config=tritongemm.MatmulConfig(
                    BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=1
                )
            ),
            ValueError,
            "config must be None",
        ),  # fmt: skip
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    a, b = _operands(Shape(32, 32), 4, torch.float32)
    with pytest.raises(error, match=message):
        tritongemm.matmul(a, b, **({"batch_invariant": True} | kwargs))


def test_modules_and_patch_carry_the_mode():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).to(DEVICE)
    tritongemm.patch(model, batch_invariant=True)
    assert all(m.batch_invariant for m in model.modules() if isinstance(m, tritongemm.nn.Linear))
    x = torch.randn(40, 64, device=DEVICE)
    with torch.no_grad():
        _assert_rows_invariant(model, x, "a patched MLP")
    with pytest.raises(ValueError, match="fuse=True's kernels cannot be batch-invariant yet"):
        tritongemm.patch(torch.nn.Linear(8, 8), batch_invariant=True, fuse=True)
    with pytest.raises(ValueError, match="fp8='tensor', whose input scale is the whole batch's absmax"):
        tritongemm.patch(torch.nn.Linear(128, 8), batch_invariant=True, fp8="tensor")
    with pytest.raises(ValueError, match="kernel must be 'auto'"):
        tritongemm.nn.Linear(8, 8, kernel="naive", batch_invariant=True)


# ----------------------------------------------------------------------------------------------
# torch's own operators under the context manager
# ----------------------------------------------------------------------------------------------

DEVICE_TYPE = DEVICE.type


def test_torch_products_and_reductions_are_invariant_inside_and_torchs_outside():
    gen = torch.Generator().manual_seed(0)
    x, w, bias = (torch.randn(*s, generator=gen).to(DEVICE) for s in ((9, 5, 64), (48, 64), (48,)))
    q, k = (torch.randn(9, 4, n, 16, generator=gen).to(DEVICE) for n in (5, 7))
    x_and_bias = torch.randn(9, 64 + 48, generator=gen).to(DEVICE)  # a row's (M, N) bias travels with it
    ops = {
        "linear": (lambda t: torch.nn.functional.linear(t, w, bias), x),
        "matmul": (lambda t: t @ w.T, x),
        "addmm, a row bias, beta and alpha": (lambda t: torch.addmm(bias, t, w.T, beta=0.5, alpha=2.0), x[:, 0]),
        "addmm, an (M, N) bias": (lambda t: torch.addmm(t[:, 64:], t[:, :64], w.T), x_and_bias),
        "addmm, a (1, N) bias": (lambda t: torch.addmm(bias[None], t, w.T), x[:, 0]),
        "bmm (attention's scores)": (lambda t: t[:, :, :5] @ t[:, :, 5:].transpose(-1, -2), torch.cat([q, k], 2)),
        "softmax": (lambda t: torch.softmax(t, -1), q),
        "log_softmax over dim 2": (lambda t: torch.log_softmax(t, 2), q),
        "mean (an RMSNorm's)": (lambda t: t.pow(2).mean(-1, keepdim=True), x),
    }
    results = {}
    with tritongemm.batch_invariant(DEVICE_TYPE):
        assert tritongemm.invariant.is_open(DEVICE_TYPE)
        for name, (op, t) in ops.items():
            results[name] = _assert_rows_invariant(op, t, name)
    assert not tritongemm.invariant.is_open(DEVICE_TYPE)
    for name, (op, t) in ops.items():  # torch's kernels again outside: the same values to rounding
        assert rel_error(results[name], op(t).double()) < 1e-5, name


def test_a_dtype_no_kernel_takes_is_refused_naming_the_operator():
    a = torch.randn(4, 4, dtype=torch.float64, device=DEVICE)
    with tritongemm.batch_invariant(DEVICE_TYPE), pytest.raises(RuntimeError, match="aten::mm .* but got float64"):
        a @ a
    assert torch.equal(a @ a, torch.mm(a, a))  # restored


def test_contexts_nest_and_check_their_device_type():
    with tritongemm.batch_invariant(DEVICE_TYPE):
        with tritongemm.batch_invariant(DEVICE_TYPE):
            pass
        assert tritongemm.invariant.is_open(DEVICE_TYPE)
    assert not tritongemm.invariant.is_open(DEVICE_TYPE)
    with pytest.raises(ValueError, match="expected device_type to be one of"):
        with tritongemm.batch_invariant("mps"):
            pass


needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="builds a transformers model"
)


@needs_transformers
def test_a_transformers_model_gives_a_sequence_the_same_logits_alone_and_in_a_batch():
    """Llama with eager attention under the context manager: the prefill's logits and each decode
    step's for a sequence alone equal its row in a batch of 8, and so do the greedy tokens."""
    import transformers

    torch.manual_seed(0)
    dims = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    if ON_GPU:
        dims = dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=8)
    config = transformers.LlamaConfig(vocab_size=96, num_hidden_layers=2, **dims, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).to(DEVICE).eval()
    prompts = torch.randint(0, 96, (8, 12), generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def decode(ids, steps=3):
        cache = transformers.DynamicCache(config=config)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        logits = [out.logits]
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            logits.append(out.logits)
        return logits

    with torch.inference_mode(), tritongemm.batch_invariant(DEVICE_TYPE):
        batch = decode(prompts)
        for row in (0, 5):
            alone = decode(prompts[row : row + 1])
            for step, (a, b) in enumerate(zip(alone, batch)):
                assert torch.equal(a[0], b[row]), f"sequence {row}, step {step}: logits differ"
    reference = decode(prompts)  # torch's kernels: the same values to rounding
    assert rel_error(batch[0], reference[0].double()) < 1e-3


# ----------------------------------------------------------------------------------------------
# The GPU: the classes' kernels against each other
# ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon class is Hopper's (WGMMA)")
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_the_gluon_class_agrees_bit_for_bit(dtype):
    """The Gluon class's claim: every plan `decode_config` makes for some M (swap-AB's unsplit tl
    kernel, rung 6 on the decode tiles and on its rules' tiles), and rung 6's other tiles, give the
    same bits, sign of zero included: row 0 of A is zeros against a weight row of negatives, whose
    products are all -0, so a member that adds a +0 step comes out +0 there (so the rules may
    change the kernel and the tile with M)."""
    from tritongemm.dispatch import tiles

    for K in (4096, 4160, 200):  # every BLOCK_K; 64 alone where 128 does not divide K; a K shorter than a ring
        a, b = _operands(Shape(4096, K), 300, dtype, "tiles")
        a[0] = 0
        b[:, 0] = -b[:, 0].abs() - 1
        plans = {invariant.decode_config(M, 4096, K, 132) for M in (1, 16, 17, 64, 128, 256, 300, 2048)}
        plans |= {(invariant.GLUON_CLASS, invariant._fit_ring(t, K)) for t in tiles.TILES}
        results = {f"{name} {config.short()}": tritongemm.matmul(a, b, kernel=name, config=config)
                   for name, config in sorted(plans, key=str)}  # fmt: skip
        first_name, first = next(iter(results.items()))
        differ = [name for name, r in results.items() if not torch.equal(_bits(r), _bits(first))]
        assert not differ, f"K = {K}: {differ} differ from {first_name}"


def test_the_mode_survives_torch_compile_and_autograd():
    """Under torch.compile the call becomes tritongemm's operator with the mode as its kernel, and
    the backward's GEMMs take the mode too."""
    a, b = _operands(Shape(48, 96), 40, torch.float32, "compile")
    compiled = torch.compile(lambda x: tritongemm.matmul(x, b, batch_invariant=True), fullgraph=True)
    assert torch.equal(compiled(a[:3]), tritongemm.matmul(a, b, batch_invariant=True)[:3])
    x = a.clone().requires_grad_()
    tritongemm.matmul(x, b, batch_invariant=True).sum().backward()
    assert rel_error(x.grad, torch.ones(40, 48, dtype=torch.float64, device=DEVICE) @ b.double().T) < 1e-5


# ----------------------------------------------------------------------------------------------
# fp8: scaled_mm with row-wise scales (a row's scale is its own, so the row is its own business)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("M", (1, 16, 17, 65, 129) + ((2048, 8192) if ON_GPU else ()))
def test_scaled_mm_rowwise_rows_are_the_same_bits_in_any_batch(M):
    gen = torch.Generator().manual_seed(M)
    x = torch.randn(M, 256, generator=gen).to(DEVICE)
    w = torch.randn(4096 if ON_GPU else 96, 256, generator=gen).to(DEVICE)
    wq, sw = tritongemm.quantize_fp8(w, "row")
    out_dtype = torch.bfloat16 if ON_GPU else torch.float32

    def compute(rows):
        xq, sx = tritongemm.quantize_fp8(rows, "row")
        return tritongemm.scaled_mm(xq, wq.T, sx, sw.T, out_dtype=out_dtype, batch_invariant=True)

    full = _assert_rows_invariant(compute, x, f"scaled_mm {M}")
    from tritongemm.fp8.recipes import reference_quantize, reference_scaled_mm

    xq, sx = reference_quantize(x, "row")
    ref = reference_scaled_mm(xq, wq.T, sx, sw.T, None, out_dtype=torch.float64)
    assert rel_error(full, ref) < 1e-2


@pytest.mark.parametrize("quantize", (None, "row", "block"))
@pytest.mark.parametrize("M", (1, 17, 129) + ((2048, 8192) if ON_GPU else ()))
def test_the_fused_rmsnorm_gives_a_row_the_same_bits_in_any_batch(M, quantize):
    """tritongemm's RMSNorm kernel (`patch(fuse=True)`'s, blocks/rms_norm_kernels.py), alone and
    quantizing its output for an fp8 GEMM: a program holds whole rows and its tile follows the width
    alone, so a row's sum of squares, its output and its fp8 copy and scale are the same bits in
    any batch."""
    from tritongemm.blocks import RMSNorm
    from tritongemm.blocks.rms_norm import kernel_serves
    from tritongemm.blocks.rms_norm_kernels import norm_forward_quantized

    width = 4096 if ON_GPU else 384
    gen = torch.Generator().manual_seed(M)
    x = (torch.randn(M, width, generator=gen) * 3).to(DEVICE)
    norm = RMSNorm(width, 1e-5, device=DEVICE)
    assert kernel_serves(x, norm.weight)  # the kernel, not the torch formula it falls back to
    with torch.no_grad():
        norm.weight.copy_(torch.randn(width, generator=gen).to(DEVICE))
        if quantize is None:
            _assert_rows_invariant(norm, x, f"RMSNorm {M}")
            return
        for output in range(3):  # y, its fp8 copy (as bytes), its scales

            def compute(rows, output=output):
                got = norm_forward_quantized(rows, norm.weight, norm.eps, norm.offset, norm.cast, quantize)[output]
                return got.view(torch.uint8) if got.dtype.itemsize == 1 else got

            _assert_rows_invariant(compute, x, f"RMSNorm {M} quantized {quantize}-wise, output {output}")


@pytest.mark.parametrize("recipe", ("row", "block"))
def test_an_fp8_patched_model_is_invariant(recipe):
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).to(DEVICE)
    tritongemm.patch(model, fp8=recipe, batch_invariant=True)
    layers = [m for m in model.modules() if isinstance(m, tritongemm.nn.Fp8Linear)]
    assert len(layers) == 2 and all(m.batch_invariant for m in layers)
    with torch.no_grad():
        _assert_rows_invariant(model, torch.randn(70, 256, device=DEVICE), f"an fp8 {recipe}-wise MLP")


def test_scaled_mm_refuses_a_config_with_the_mode():
    xq, sx = tritongemm.quantize_fp8(torch.randn(4, 128, device=DEVICE), "row")
    config = tritongemm.MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=1)
    with pytest.raises(ValueError, match="config must be None"):
        tritongemm.scaled_mm(xq, xq.T, sx, sx.T, batch_invariant=True, config=config)


# ----------------------------------------------------------------------------------------------
# grouped_mm: an expert's rows whatever the other experts got
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("glu", (None, "silu"))
@pytest.mark.parametrize("counts", [(3, 0, 17, 1), (40, 1, 2, 300)] + ([(1, 2048, 5, 8192)] if ON_GPU else []))
def test_grouped_rows_are_the_same_bits_whatever_the_other_groups_hold(counts, glu):
    """Group 0's rows against the same rows with the other groups' counts changed (emptied, grown,
    shrunk), and alone; and against the fp64 product."""
    dtype = DTYPES[0]
    G, K, N = len(counts), 72, 96
    gen = torch.Generator().manual_seed(sum(counts))
    experts = torch.randn(G, N, K, generator=gen).to(DEVICE, dtype).transpose(1, 2)  # MoE weights, read transposed
    rows = torch.randn(3 * sum(counts) + G, K, generator=gen).to(DEVICE, dtype)

    def group0(other_counts):
        c = (counts[0], *other_counts)
        offs = torch.tensor(c, device=DEVICE).cumsum(0).to(torch.int32)
        out = tritongemm.grouped_mm(rows[: sum(c)], experts, offs, glu=glu, batch_invariant=True)
        return out[: counts[0]]

    first = group0(counts[1:])
    for others in ((0,) * (G - 1), tuple(n * 2 + 1 for n in counts[1:]), tuple(n // 3 for n in counts[1:])):
        assert torch.equal(group0(others), first), others
    z = rows[: counts[0]].double() @ experts[0].double()
    if glu:
        gate, up = z.chunk(2, dim=-1)
        z = torch.nn.functional.silu(gate) * up
    assert rel_error(first, z) <= tolerance(dtype, K) * 4


def test_grouped_mode_refuses_autograd_and_a_non_bool():
    a = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    b = torch.randn(2, 8, 8, device=DEVICE)
    offs = torch.tensor([2, 4], dtype=torch.int32, device=DEVICE)
    with pytest.raises(RuntimeError, match="eager inference only"):
        tritongemm.grouped_mm(a, b, offs, batch_invariant=True)
    with pytest.raises(TypeError, match="expected batch_invariant to be a bool"):
        tritongemm.grouped_mm(a.detach(), b, offs, batch_invariant="yes")


def test_a_named_recipe_must_fit_the_scales():
    """`recipe=` settles one-element scales (block-wise at M = 1, K = 128, N <= 128); it may not
    rename scales whose shapes say another recipe."""
    x = torch.randn(1, 128, device=DEVICE)
    xq, sx = tritongemm.quantize_fp8(x, "block")
    wq, sw = tritongemm.quantize_fp8(torch.randn(64, 128, device=DEVICE), "block", block=(128, 128))
    out = torch.float32 if not ON_GPU else torch.bfloat16
    as_block = tritongemm.scaled_mm(xq, wq.T, sx, sw, out_dtype=out, recipe="block", batch_invariant=True)
    bq, bs = tritongemm.quantize_fp8(torch.cat([x, torch.randn(9, 128, device=DEVICE)]), "block")
    batch = tritongemm.scaled_mm(bq, wq.T, bs, sw, out_dtype=out, batch_invariant=True)
    assert torch.equal(as_block, batch[:1])
    rq, rs = tritongemm.quantize_fp8(torch.randn(8, 128, device=DEVICE), "row")
    with pytest.raises(ValueError, match="recipe='block' was given, but .* are row-wise scales"):
        tritongemm.scaled_mm(rq, wq.T, rs, torch.ones(1, 64, device=DEVICE), recipe="block")
    with pytest.raises(ValueError, match="expected recipe to be None or one of"):
        tritongemm.scaled_mm(xq, wq.T, sx, sw, recipe="blockwise")
