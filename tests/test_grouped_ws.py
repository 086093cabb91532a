"""grouped_mm's row groups on the Hopper Gluon kernel (grouped/ws.py, entry point
grouped.api.grouped_mm_ws): on the CPU what it takes and its shared memory; on an sm_90 GPU every
case against the fp64 reference, each in a process of its own (a wrong barrier phase hangs a
warp-specialized kernel: test_warp_specialized.run_isolated fails it after a time limit)."""

import pytest
import torch
from cases import ON_HOPPER
from test_warp_specialized import run_isolated

from tritongemm.grouped import ws as grouped_ws
from tritongemm.primitives.gluon.compat import CLUSTER_MULTICAST
from tritongemm.primitives.gluon.pipeline import _SMEM_SLACK_BYTES, H100_SHARED_MEMORY_BYTES, check_wgmma_tile


def _operands(G, M, N, K, dtype=torch.bfloat16, device="cpu"):
    """a (M, K), b (G, K, N) the transpose of (G, N, K) weights, as MoE experts are stored."""
    return torch.empty(M, K, dtype=dtype, device=device), torch.empty(G, N, K, dtype=dtype, device=device).transpose(
        1, 2
    )


def test_it_takes_row_major_a_and_k_major_weights():
    a, b = _operands(4, 100, 64, 32)
    assert grouped_ws.unsupported_reason(a, b) is None
    assert grouped_ws.unsupported_reason(a, b, "silu") is None
    assert "rows on 16 bytes" in grouped_ws.unsupported_reason(torch.empty(100, 33, dtype=torch.bfloat16)[:, :32], b)
    assert "it takes" in grouped_ws.unsupported_reason(a.float(), b.float())


def test_n_major_weights_need_whole_k_steps_and_no_gated_pair():
    """b contiguous (G, K, N): the weights read untransposed (an MoE layer's input gradient). Its
    groups are stacked along K, so K must be whole K-steps; a gated pair's halves are rows of
    K-major weights."""
    a, b = _operands(4, 100, 64, 128)
    n_major = b.contiguous()
    assert grouped_ws.unsupported_reason(a, n_major) is None
    assert "glu='silu'" in grouped_ws.unsupported_reason(a, n_major, "silu")
    a, b = _operands(4, 100, 64, 96)
    reason = grouped_ws.unsupported_reason(a, b.contiguous())
    assert "K a multiple of 64" in reason and "but K is 96" in reason
    neither = torch.empty(4, 128, 128, dtype=torch.bfloat16)[:, :, :64]
    assert "b must be the transpose" in grouped_ws.unsupported_reason(a, neither[:, :96])


def test_its_configs_fit_with_cs_tile():
    assert grouped_ws.smem_bytes(grouped_ws.DEFAULT_CONFIG, 2) == 4 * 49152 + 32768  # C in two halves
    assert grouped_ws.c_pieces(grouped_ws.DEFAULT_CONFIG, 2) == 2
    assert grouped_ws.smem_bytes(grouped_ws.GATED_CONFIG, 2, gated=True) == 4 * 49152 + 32768  # C whole
    assert grouped_ws.c_pieces(grouped_ws.GATED_CONFIG, 2, gated=True) == 1
    budget = H100_SHARED_MEMORY_BYTES - _SMEM_SLACK_BYTES
    for rows, groups in ((16384, 8), (8, 128), (64, 1)):
        for gated in (False, True):
            config = grouped_ws.default_config(rows, groups, gated)
            assert grouped_ws.smem_bytes(config, 2, gated) <= budget
            check_wgmma_tile("grouped_ws", config)
    assert grouped_ws.default_config(8, 128, False) == grouped_ws.SMALL_CONFIG  # a decode step
    assert grouped_ws.default_config(16384, 8, True) == grouped_ws.GATED_CONFIG


# (group sizes, rows after the last group, N, K): ragged with an empty group, one group, one row
# each, a decode step (a few rows over many groups), N and K off the tile sizes, rows past the end.
CASES = [((70, 0, 230, 150), 5, 200, 136), ((400,), 0, 128, 64), ((1, 1, 1, 1, 1), 3, 96, 256),
         ((0,) * 60 + (3, 0, 2) + (0,) * 65, 0, 1536, 2048), ((300, 129), 200, 264, 72)]  # fmt: skip


# N-major weights (K whole K-steps): the same shapes with K on 64.
N_MAJOR_CASES = [((70, 0, 230, 150), 5, 200, 128), ((400,), 0, 128, 64), ((1, 1, 1, 1, 1), 3, 96, 256),
                 ((0,) * 60 + (3, 0, 2) + (0,) * 65, 0, 1536, 2048), ((300, 129), 200, 264, 192)]  # fmt: skip


def _run_case(spec: dict) -> None:
    """One GPU case (in the child process): C against the fp64 reference, rows past the last
    group zeros; `num_programs` gives each program several tiles. `n_major`: b is contiguous
    (G, K, N), the weights read untransposed."""
    from tritongemm.core.reference import rel_error, tolerance
    from tritongemm.grouped.api import grouped_mm_ws, reference_grouped_mm

    dtype = getattr(torch, spec["dtype"].removeprefix("torch."))
    sizes, tail, N, K, glu = spec["sizes"], spec["tail"], spec["N"], spec["K"], spec["glu"]
    M, G = sum(sizes) + tail, len(sizes)
    offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    NB = 2 * N if glu else N
    b = (torch.randn(G, NB, K, device="cuda") * K**-0.5).to(dtype).transpose(1, 2)
    if spec.get("n_major"):
        b = b.contiguous()
    cluster = spec.get("cluster", 1)
    if spec["num_programs"] or cluster > 1:
        outs = []
        for ctas in sorted({1, cluster}):  # a cluster's result against one CTA's
            c = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
            grouped_ws.plan(a, b, offs, c, glu=glu, num_programs=spec["num_programs"], cluster=ctas)(a, b, offs, c)
            outs.append(c)
        assert torch.equal(outs[0], outs[-1]), f"{spec}: the cluster's C is not one CTA's, bit for bit"
    else:
        c = grouped_mm_ws(a, b, offs, glu=glu)
    torch.cuda.synchronize()
    expected = reference_grouped_mm(a, b, offs, glu=glu).double()
    bound = (2 if glu else 1) * tolerance(dtype, K)
    assert torch.isfinite(c).all(), f"{spec}: NaN left in C"
    assert (c[M - tail :] == 0).all(), f"{spec}: rows past the last group are not zeros"
    err = rel_error(c, expected)
    assert err <= bound, f"{spec}: relative error {err:.3e} > {bound:.3e}"


@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA, WGMMA and setmaxnreg")
@pytest.mark.parametrize("glu", [None, "silu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("num_programs", [None, 3])
def test_grouped_ws(case, dtype, glu, num_programs):
    sizes, tail, N, K = case
    spec = dict(sizes=list(sizes), tail=tail, N=N, K=K, glu=glu, dtype=str(dtype), num_programs=num_programs)
    run_isolated(spec, module="test_grouped_ws")


@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA, WGMMA and setmaxnreg")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", N_MAJOR_CASES, ids=str)
@pytest.mark.parametrize("num_programs", [None, 3])
def test_grouped_ws_n_major_weights(case, dtype, num_programs):
    sizes, tail, N, K = case
    spec = dict(sizes=list(sizes), tail=tail, N=N, K=K, glu=None, dtype=str(dtype), num_programs=num_programs,
                n_major=True)  # fmt: skip
    run_isolated(spec, module="test_grouped_ws")


# A cluster's tile is two tiles in one group: groups ending inside its upper or lower half, or
# filling it, and groups of a few rows.
CLUSTER_CASES = [*N_MAJOR_CASES, ((700, 0, 300, 1100, 128), 100, 768, 512)]


@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA, WGMMA and setmaxnreg")
@pytest.mark.skipif(not CLUSTER_MULTICAST, reason="a two-CTA cluster needs TMA multicast (triton >= 3.8)")
@pytest.mark.parametrize("n_major", [False, True])
@pytest.mark.parametrize("case", CLUSTER_CASES, ids=str)
@pytest.mark.parametrize("num_programs", [None, 6])
def test_grouped_ws_on_a_two_cta_cluster_gives_the_one_cta_bits(case, n_major, num_programs):
    """grouped/ws.py's cluster (CLUSTER = 2: two tiles of one group, the weight's tile multicast
    into both CTAs): the one-CTA kernel's result bit for bit (the same MMAs in each CTA), against
    the fp64 reference, rows past the last group zeros, one and several tiles a cluster."""
    sizes, tail, N, K = case
    spec = dict(sizes=list(sizes), tail=tail, N=N, K=K, glu=None, dtype="torch.bfloat16", num_programs=num_programs,
                n_major=n_major, cluster=2)  # fmt: skip
    run_isolated(spec, module="test_grouped_ws")


def test_the_cluster_is_refused_where_it_cannot_run(monkeypatch):
    """A gated pair, or a Triton without multicast: a ValueError naming what was asked."""
    a, b = _operands(4, 100, 64, 128)
    c = torch.empty(100, 32, dtype=torch.bfloat16)
    monkeypatch.setattr(grouped_ws, "CLUSTER_MULTICAST", True)
    with pytest.raises(ValueError, match="cluster=2, glu='silu'"):
        grouped_ws.plan(a, b, torch.zeros(4, dtype=torch.int32), c, glu="silu", cluster=2)
    monkeypatch.setattr(grouped_ws, "CLUSTER_MULTICAST", False)
    with pytest.raises(ValueError, match="cluster is 1, or 2 where this Triton multicasts"):
        grouped_ws.plan(a, b, torch.zeros(4, dtype=torch.int32), torch.empty(100, 64, dtype=torch.bfloat16), cluster=2)


@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA, WGMMA and setmaxnreg")
@pytest.mark.parametrize("n_major", [False, True])
@pytest.mark.parametrize("glu", [None, "silu"])
@pytest.mark.parametrize("G, mean, N, taken", [(8, 200, 264, True), (4, 130, 264, True), (8, 1100, 264, True),
                                               (16, 40, 264, False), (8, 200, 260, False)])  # fmt: skip
def test_grouped_mm_takes_it_for_large_groups(G, mean, N, taken, glu, n_major, monkeypatch):
    """grouped_mm's plan takes grouped_ws for row groups (plain or a gated pair) of WS_FROM_MEAN_ROWS
    rows or more on average (ragged ones here, with an empty group), and the `tl` kernel elsewhere;
    right either way. Not where C's rows miss 16 bytes (N = 260), which its TMA store needs, nor
    for a gated pair on N-major weights (b contiguous, as an MoE layer's input gradient reads them)."""
    import tritongemm
    from tritongemm.core.reference import rel_error, tolerance
    from tritongemm.grouped.api import reference_grouped_mm

    planned = []
    real_plan = grouped_ws.plan
    monkeypatch.setattr(grouped_ws, "plan", lambda *args, **kwargs: planned.append(1) or real_plan(*args, **kwargs))
    gen = torch.Generator().manual_seed(G * mean)
    sizes = torch.full((G,), mean)
    sizes[:4] = torch.tensor([2 * mean - 3, 0, mean + 5, mean - 5])  # ragged, one group empty
    M, K = int(sizes.sum()), 192
    offs = sizes.cumsum(0).to(torch.int32).cuda()
    a = torch.randn(M, K, generator=gen).to("cuda", torch.bfloat16)
    NB = 2 * N if glu else N
    b = (torch.randn(G, NB, K, generator=gen) * K**-0.5).to("cuda", torch.bfloat16).transpose(1, 2)
    if n_major:
        b = b.contiguous()
    c = tritongemm.grouped_mm(a, b, offs, glu=glu)
    assert bool(planned) == (taken and not (n_major and glu))
    bound = (2 if glu else 1) * tolerance(torch.bfloat16, K)
    assert rel_error(c, reference_grouped_mm(a, b, offs, glu=glu).double()) <= bound
