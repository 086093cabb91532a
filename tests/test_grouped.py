"""grouped_mm and bmm: each form against the fp64 reference, group by group, with ragged, empty
and single groups and rows past the last group; gradients against torch's on the same groups;
bad input refused before any launch; a fuzz over group sizes. On the CPU the `triton.language`
kernels run under the interpreter (fp16, fp32); on a GPU every dtype, and torch._grouped_mm too."""

from __future__ import annotations

import zlib

import pytest
import torch
import triton
import triton.language as tl
from cases import DEVICE, DTYPES, ON_GPU
from moe_models import TINY_MOE, tiny_moe_model

import tritongemm
from tritongemm.bench.report import csv_fields
from tritongemm.core.reference import rel_error, tolerance
from tritongemm.grouped import reference_grouped_mm
from tritongemm.grouped.tl import offsets_in_order


def rand(*shape, dtype=torch.float32, seed=""):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape}{dtype}{seed}".encode()))
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)


def ends(sizes) -> torch.Tensor:
    """Group ends (offs) for groups of these sizes."""
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(DEVICE)


def check(y, expected, dtype, K):
    assert y.shape == expected.shape and y.dtype == expected.dtype
    assert rel_error(y, expected.double()) <= tolerance(dtype, max(K, 1)), f"{rel_error(y, expected.double()):.3e}"


# (group sizes along M, rows after the last group, K, N): ragged, empty, one group, one row each.
M_CASES = [((7, 0, 23, 15), 5, 24, 20), ((40,), 0, 16, 8), ((0, 0, 3), 0, 8, 16), ((1, 1, 1, 1, 1), 2, 40, 33)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sizes, tail, K, N", M_CASES, ids=str)
def test_groups_along_m(sizes, tail, K, N, dtype):
    """The MoE forward: rows offs[g-1]:offs[g] of a times b[g]; rows past the last end are zeros."""
    M = sum(sizes) + tail
    a, b, offs = rand(M, K, dtype=dtype), rand(len(sizes), K, N, dtype=dtype), ends(sizes)
    y = tritongemm.grouped_mm(a, b, offs)
    check(y, reference_grouped_mm(a, b, offs), dtype, K)
    assert not y[sum(sizes) :].any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sizes", [(5, 0, 28), (33,), (0,)], ids=str)
def test_groups_along_k(sizes, dtype):
    """The weight gradient: columns offs[g-1]:offs[g] of a times those rows of b; an empty group's
    product is zeros."""
    K = sum(sizes) + 3
    a, b, offs = rand(10, K, dtype=dtype), rand(K, 12, dtype=dtype), ends(sizes)
    check(tritongemm.grouped_mm(a, b, offs), reference_grouped_mm(a, b, offs), dtype, K)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bmm_and_strided_operands(dtype):
    a, b = rand(3, 9, 24, dtype=dtype), rand(3, 20, 24, dtype=dtype).transpose(1, 2)  # b: a transposed view
    check(tritongemm.bmm(a, b), reference_grouped_mm(a, b), dtype, 24)
    a2 = rand(24, 50, dtype=dtype).T  # a column-major (M, K)
    offs = ends((20, 30))
    check(tritongemm.grouped_mm(a2, b[:2], offs), reference_grouped_mm(a2, b[:2], offs), dtype, 24)


def test_out_dtype_float32():
    a, b, offs = rand(12, 16, dtype=torch.float16), rand(2, 16, 8, dtype=torch.float16), ends((5, 7))
    y = tritongemm.grouped_mm(a, b, offs, out_dtype=torch.float32)
    check(y, reference_grouped_mm(a, b, offs, out_dtype=torch.float32), torch.float16, 16)


@pytest.mark.parametrize("form", ["m", "k", "batched"])
def test_gradients_match_torch_on_the_same_groups(form):
    """Against torch autograd through per-group matmuls in float64."""
    if form == "m":
        a, b, offs = rand(30, 16), rand(3, 16, 8), ends((10, 0, 17))
    elif form == "k":
        a, b, offs = rand(6, 30), rand(30, 8), ends((10, 0, 17))
    else:
        a, b, offs = rand(3, 5, 16), rand(3, 16, 8), None
    a.requires_grad_(), b.requires_grad_()
    weights = rand(*tritongemm.grouped_mm(a.detach(), b.detach(), offs).shape, seed="w")
    (tritongemm.grouped_mm(a, b, offs) * weights).sum().backward()
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (_grouped_in_torch(a64, b64, offs) * weights.double()).sum().backward()
    assert rel_error(a.grad, a64.grad) <= tolerance(torch.float32, 32) and rel_error(b.grad, b64.grad) <= tolerance(
        torch.float32, 32
    )


@pytest.mark.parametrize("glu", [None, "silu"])
def test_a_transposed_weights_gradient_is_laid_out_as_the_weight(glu):
    """An MoE weight is stored (experts, out, in) and read as its transposed view: its gradient is
    computed in that layout, so autograd hands it over without a copy (in a Mixtral training step
    those copies took longer than the weight-gradient GEMMs)."""
    a, offs = rand(31, 16, seed="a").requires_grad_(), ends((10, 0, 17))
    weight = rand(3, 2 * 8 if glu else 8, 16, seed="w").requires_grad_()  # (experts, out, in)
    y = tritongemm.grouped_mm(a, weight.transpose(1, 2), offs, glu=glu)
    weights = rand(*y.shape, seed="g")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        (y * weights).sum().backward()
    copies = [e for e in prof.events() if e.name == "aten::copy_" and list(weight.shape) in e.input_shapes]
    assert not copies and weight.grad.is_contiguous()
    a64, w64 = a.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    out = _grouped_in_torch(a64, w64.transpose(1, 2), offs)
    if glu:
        from tritongemm.core.epilogue import activate_torch

        gate, up = out.chunk(2, dim=-1)
        out = activate_torch(gate, glu) * up
    (out * weights.double()).sum().backward()
    assert rel_error(weight.grad, w64.grad) <= tolerance(torch.float32, 32)
    assert rel_error(a.grad, a64.grad) <= tolerance(torch.float32, 32)


def _grouped_in_torch(a, b, offs):
    """grouped_mm as differentiable torch ops, group by group."""
    if offs is None:
        return a @ b
    bounds = [0, *offs.tolist()]
    if b.dim() == 3:
        parts = [a[s:e] @ b[g] for g, (s, e) in enumerate(zip(bounds, bounds[1:]))]
        return torch.cat([*parts, a.new_zeros(a.shape[0] - bounds[-1], b.shape[2])])
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(bounds, bounds[1:])])


@pytest.mark.skipif(not ON_GPU, reason="torch._grouped_mm's kernels are CUDA's (its CPU path wants 16-byte strides)")
def test_agrees_with_torch_grouped_mm():
    a, b, offs = rand(300, 128, dtype=torch.bfloat16), rand(4, 128, 64, dtype=torch.bfloat16), ends((50, 0, 130, 120))
    expected = torch._grouped_mm(a, b, offs)
    assert rel_error(tritongemm.grouped_mm(a, b, offs), expected.double()) <= tolerance(torch.bfloat16, 128)


def _bad_calls():
    a, b, offs = rand(10, 8), rand(2, 8, 4), ends((4, 6))
    return [
        (lambda: tritongemm.grouped_mm(a.double(), b, offs), TypeError, "expected a of dtype float16, bfloat16"),
        (lambda: tritongemm.grouped_mm(a, b.half(), offs), TypeError, "expected a and b of one dtype"),
        (lambda: tritongemm.grouped_mm(a, b[0, 0], offs), ValueError, "2 and 3, 3 and 3, or 2 and 2 dimensions"),
        (lambda: tritongemm.grouped_mm(a[:, :5], b, offs), ValueError, r"disagree on K \(5 != 8\)"),
        (lambda: tritongemm.grouped_mm(a, b), TypeError, "expected offs, an int32 tensor of group ends"),
        (lambda: tritongemm.grouped_mm(a, b, offs.long()), TypeError, "expected offs a 1-D int32 tensor"),
        (lambda: tritongemm.grouped_mm(a, b, offs[:1]), ValueError, r"expected offs of 2 group ends \(b's groups\)"),
        (lambda: tritongemm.grouped_mm(a, b, ends((6, 4)).flip(0)), ValueError, r"sorted group ends between 0 and 10"),
        (lambda: tritongemm.grouped_mm(a, b, ends((6, 5))), ValueError, r"between 0 and 10, but got \[6, 11\]"),
        (lambda: tritongemm.grouped_mm(a[None], b[:1], offs), ValueError, "a 3-D a is its own groups"),
        (lambda: tritongemm.grouped_mm(a, b, offs, out_dtype=torch.int32), TypeError, "expected out_dtype None"),
        (lambda: tritongemm.bmm(a, b), ValueError, r"expected a \(G, M, K\) and b \(G, K, N\)"),
    ]


@pytest.mark.parametrize("index", range(12))
def test_bad_input_is_refused_naming_it(index):
    if ON_GPU and index in (7, 8):
        pytest.skip("offs' values are checked at once on the CPU; a GPU checks them without waiting")
    call, exc, pattern = _bad_calls()[index]
    with pytest.raises(exc, match=pattern):
        call()


@triton.jit
def _offsets_flags_kernel(offs_ptr, flags_ptr, G, length, BLOCK: tl.constexpr):
    """_check_offsets_kernel's walk, storing offsets_in_order's answers instead of asserting them."""
    for start in range(0, G, BLOCK):
        i = start + tl.arange(0, BLOCK)
        tl.store(flags_ptr + i, offsets_in_order(offs_ptr, i, G, length).to(tl.int32), mask=i < G)


# (offs, length): in order, empty groups, the length reached; then out of order, past the length,
# negative; more ends than one block of the check holds.
OFFSETS = [([0, 3, 3, 7], 7, True), ([5], 5, True), ([2, 1], 5, False), ([1, 9], 5, False), ([-1, 2], 5, False),
           (list(range(40)), 40, True), ([*range(30), 2, 31], 40, False), (list(range(40)), 38, False)]  # fmt: skip


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the check's condition (the GPU's own run asserts)")
@pytest.mark.parametrize("offs, length, ok", OFFSETS, ids=str)
def test_the_device_check_of_offs_reads_them_as_the_cpu_check_does(offs, length, ok):
    """grouped/tl.py `offsets_in_order`, the condition `_check_offsets_kernel` asserts on the
    GPU (the interpreter skips device_assert), block by block as the kernel walks them."""
    t = torch.tensor(offs, dtype=torch.int32)
    flags = torch.full((len(offs),), -1, dtype=torch.int32)
    _offsets_flags_kernel[(1,)](t, flags, len(offs), length, BLOCK=16)
    assert bool(flags.all()) == ok and int(flags.min()) >= 0


_BAD_OFFS_ON_THE_GPU = """
import torch, tritongemm
a, b = torch.randn(10, 8, device="cuda"), torch.randn(2, 8, 4, device="cuda")
tritongemm.grouped_mm(a, b, torch.tensor({offs}, dtype=torch.int32, device="cuda"))
torch.cuda.synchronize()
print("no error")
"""


@pytest.mark.skipif(not ON_GPU, reason="the GPU's check of offs: a device-side assert at the next synchronization")
@pytest.mark.parametrize("offs, ok", [([4, 10], True), ([6, 4], False), ([6, 11], False)], ids=str)
def test_bad_offs_on_the_gpu_fail_the_next_synchronization(offs, ok):
    """In a process of its own: a device-side assert leaves the CUDA context unusable."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _BAD_OFFS_ON_THE_GPU.format(offs=offs)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    if ok:
        assert done.returncode == 0 and "no error" in done.stdout, done.stderr[-2000:]
    else:
        assert done.returncode != 0 and "no error" not in done.stdout
        assert "expected offs sorted group ends" in done.stderr + done.stdout, done.stderr[-2000:]


def test_fuzz_over_group_sizes():
    """Random group counts and sizes (empty ones often), K, N and a tail past the last group."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40 if not ON_GPU else 200, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(sizes=st.lists(st.integers(0, 40).map(lambda n: n if n > 10 else n % 3), min_size=1, max_size=6),
           tail=st.integers(0, 5), K=st.integers(1, 48), N=st.integers(1, 40))  # fmt: skip
    def run(sizes, tail, K, N):
        a, b, offs = rand(sum(sizes) + tail, K, seed=sizes), rand(len(sizes), K, N, seed=sizes), ends(sizes)
        check(tritongemm.grouped_mm(a, b, offs), reference_grouped_mm(a, b, offs), torch.float32, K)

    run()


# ----------------------------------------------------------------------------------------------
# Hugging Face MoE models: tritongemm as their experts implementation
# ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(ON_GPU, reason="tiny fp32 models for the interpreter; the H100 runs bench model's")
@pytest.mark.parametrize("architecture", list(TINY_MOE))
def test_patch_runs_a_moe_models_experts_on_grouped_mm(architecture):
    """patch selects the "tritongemm" experts implementation; its logits and the experts'
    gradients match transformers' eager experts (a loop of F.linear per expert)."""
    model = tiny_moe_model(architecture)
    ids = torch.randint(0, 128, (2, 9))
    results = {}
    for implementation in ("eager", "tritongemm"):
        if implementation == "tritongemm":
            tritongemm.patch(model)
            assert model.tritongemm_patch_report.experts == "tritongemm"
        else:
            model.set_experts_implementation(implementation)
        model.zero_grad()
        out = model(ids, labels=ids)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if "experts" in n and p.grad is not None}
        results[implementation] = (out.logits.detach(), grads)
    (logits, grads), (ref_logits, ref_grads) = results["tritongemm"], results["eager"]
    assert grads.keys() == ref_grads.keys() and grads
    assert rel_error(logits, ref_logits.double()) <= 1e-5
    assert max(rel_error(grads[n], ref_grads[n].double()) for n in grads) <= 1e-5


@pytest.mark.skipif(ON_GPU, reason="the CPU's smoke run (the H100 runs the suite)")
def test_bench_grouped_checks_times_and_writes(tmp_path):
    import csv

    from tritongemm.bench import grouped

    rows = grouped.run_grouped(out_dir=tmp_path, rounds=1)
    assert {r.provider for r in rows} == set(grouped.PROVIDERS) - {"tritongemm-ws"}  # the latter: sm_90 only
    assert all(r.status == "ok" for r in rows if r.provider == "tritongemm")
    with open(tmp_path / "grouped-cpu.csv") as f:
        assert list(next(csv.DictReader(f))) == csv_fields(grouped.COLUMNS)
    assert {p.experts for p in grouped.SUITE} >= {8, 64, 128} and min(p.tokens for p in grouped.SUITE) == 1


@pytest.mark.parametrize("group_size_m", [1, 2, 8])
def test_the_schedule_twin_covers_every_tile_once_in_turn(group_size_m):
    """tools/grouped_schedule.py: each group's row tiles (partial ones, none for an empty group, the
    zero tail), once each, tile t to program t % programs, every program's steps in order."""
    from tritongemm.tools.grouped_schedule import schedule

    sizes, tail, N, BM, BN, P = [70, 0, 150, 20], 24, 256, 32, 64, 3
    tiles = schedule(sizes, tail, N, BM, BN, P, group_size_m)
    expected = sum(-(-rows // BM) for rows in [*sizes, tail]) * (N // BN)
    assert len(tiles) == len({(t.row, t.col) for t in tiles}) == expected
    assert [t.program for t in tiles] == [i % P for i in range(expected)]
    assert all(t.step == i // P for i, t in enumerate(tiles))
    assert {t.group for t in tiles} == {0, 2, 3, 4}  # the empty group has no tile; 4: the tail


def test_bmm_of_empty_groups():
    assert tritongemm.bmm(rand(3, 0, 8), rand(3, 8, 5)).shape == (3, 0, 5)
    assert tritongemm.bmm(rand(0, 4, 8), rand(0, 8, 5)).shape == (0, 4, 5)


@pytest.mark.parametrize("glu", ["silu", "gelu", "gelu_tanh"])
def test_the_gated_pair_in_the_epilogue(glu):
    """b's columns [gate; up]: glu(a @ gate) * (a @ up) in one kernel, against the fp64 reference;
    with autograd recording, the pair kept from one grouped GEMM and gated apart (_GroupedPair),
    its output and gradients against torch's through the unfused ops."""
    from tritongemm.core.epilogue import activate_torch

    sizes = (9, 0, 14)
    a, b, offs = rand(sum(sizes) + 3, 16, seed=glu), rand(3, 16, 2 * 12, seed=glu), ends(sizes)
    y = tritongemm.grouped_mm(a, b, offs, glu=glu)
    assert y.shape == (26, 12)
    check(y, reference_grouped_mm(a, b, offs, glu=glu), torch.float32, 16)
    a.requires_grad_(), b.requires_grad_()
    weights = rand(26, 12, seed="w")
    y = tritongemm.grouped_mm(a, b, offs, glu=glu)
    check(y, reference_grouped_mm(a, b, offs, glu=glu), torch.float32, 16)
    (y * weights).sum().backward()
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    gate, up = _grouped_in_torch(a64, b64, offs).chunk(2, dim=-1)
    (activate_torch(gate, glu) * up * weights.double()).sum().backward()
    assert rel_error(a.grad, a64.grad) <= tolerance(torch.float32, 32)
    assert rel_error(b.grad, b64.grad) <= tolerance(torch.float32, 32)
    with pytest.raises(ValueError, match="glu takes one of"):
        tritongemm.grouped_mm(a, b[:, :, :23], offs, glu=glu)


BACKEND = "inductor" if ON_GPU else "aot_eager"


@pytest.mark.parametrize("form", ["m", "m-glu", "k", "batched"])
def test_torch_compile_fullgraph_forward_and_backward(form):
    """Under torch.compile grouped_mm is the `torch.ops.tritongemm.grouped_mm` operator: one graph,
    the same results and gradients as eager."""
    glu = "silu" if form == "m-glu" else None
    if form.startswith("m"):
        a, b, offs = rand(30, 16), rand(3, 16, 8), ends((10, 0, 17))
    elif form == "k":
        a, b, offs = rand(6, 30), rand(30, 8), ends((10, 0, 17))
    else:
        a, b, offs = rand(3, 5, 16), rand(3, 16, 8), None

    def fn(a, b, offs):
        return tritongemm.grouped_mm(a, b, offs, glu=glu) * 2

    compiled = torch.compile(fn, fullgraph=True, backend=BACKEND)
    results = []
    for f in (compiled, fn):
        x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
        out = f(x, y, offs)
        out.square().sum().backward()
        results.append((out.detach(), x.grad, y.grad))
    for got, expected in zip(*results):
        assert rel_error(got, expected.double()) <= tolerance(torch.float32, 32)


def test_a_compiled_gated_pair_keeps_the_pair_for_the_backward(monkeypatch):
    """Where autograd records, a compiled gated pair is the plain grouped GEMM of [gate; up] and
    the gating in torch (Inductor fuses it): the backward reuses the pair instead of a third
    grouped GEMM to compute it again. Three GEMMs in all (the pair, dA, dB), none gated."""
    from tritongemm.grouped import api

    calls = []
    direct = api.direct
    monkeypatch.setattr(api, "direct", lambda *args: calls.append(args[3:]) or direct(*args))
    a, b, offs = rand(30, 16), rand(3, 16, 8), ends((10, 0, 17))
    fn = torch.compile(lambda a, b, o: tritongemm.grouped_mm(a, b, o, glu="silu"), fullgraph=True, backend=BACKEND)
    x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
    fn(x, y, offs).square().sum().backward()
    assert len(calls) == 3 and all(glu is None for _, glu in calls), calls


def test_the_operator_passes_opcheck():
    a, b, offs = rand(12, 16), rand(2, 16, 8), ends((5, 7))
    torch.library.opcheck(torch.ops.tritongemm.grouped_mm.default, (a, b, offs), {"glu": "gelu"})
    torch.library.opcheck(torch.ops.tritongemm.grouped_mm.default, (a.requires_grad_(), b.requires_grad_(), offs))


def test_inductor_calls_the_implementation_directly():
    """inductor.py's lowering: the generated code calls grouped_mm's implementation, not the
    operator through the dispatcher (Inductor's CPU backend on the CPU)."""
    from torch._inductor.utils import run_and_get_code

    a, b, offs = rand(30, 16), rand(3, 16, 8), ends((10, 0, 17))
    compiled = torch.compile(lambda a, b, o: tritongemm.grouped_mm(a, b, o, glu="silu"), backend="inductor")
    y, codes = run_and_get_code(compiled, a, b, offs)
    check(y, reference_grouped_mm(a, b, offs, glu="silu"), torch.float32, 16)
    code = "\n".join(codes)
    assert "tritongemm_direct_grouped_mm(" in code and "tritongemm.grouped_mm.default(" not in code
