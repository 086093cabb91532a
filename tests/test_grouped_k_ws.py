"""grouped_mm's K groups on the Hopper Gluon kernel (grouped/k_ws.py): on the CPU what it
takes; on an sm_90 GPU every case against the fp64 reference, each in a process of its own (a
wrong barrier phase hangs a warp-specialized kernel: test_warp_specialized.run_isolated fails it
after a time limit)."""

import pytest
import torch
from cases import ON_HOPPER
from test_warp_specialized import run_isolated

from tritongemm.grouped import k_ws as grouped_k_ws


def test_it_takes_the_weight_gradients_layouts():
    """A M-major and B row-major, K outermost in both (a group's first K-step starts at any index,
    which TMA takes in an outer dimension only), as TMA reads them in place."""
    a, b = torch.empty(304, 64, dtype=torch.bfloat16).T, torch.empty(304, 96, dtype=torch.bfloat16)
    assert grouped_k_ws.unsupported_reason(a, b) is None
    for other in ((a.contiguous(), b), (a, b.T.contiguous().T)):
        assert "outer dimension only" in grouped_k_ws.unsupported_reason(*other)
    assert "16 bytes" in grouped_k_ws.unsupported_reason(a, torch.empty(304, 90, dtype=torch.bfloat16))
    assert "take" in grouped_k_ws.unsupported_reason(a.float(), b.float())


# (group sizes along K, M, N): ragged with an empty group and sizes off BLOCK_K (64), one group, one
# row each, many small groups, M off the tile (C's masked store) and N off it (its TMA clips).
CASES = [((70, 0, 230, 150), 200, 136), ((400,), 128, 256), ((1, 1, 1, 1, 1), 96, 64),
         ((0,) * 6 + (3, 0, 2) + (0,) * 7, 136, 264), ((300, 129, 64), 1000, 1504)]  # fmt: skip


def _run_case(spec: dict) -> None:
    """One GPU case (in the child process): C against the fp64 reference, every group's (zeros for
    an empty one), from a C poisoned with NaN; with `poison_next`, the K rows of every other group
    hold NaN and inf, and the groups beside them must not see it."""
    from tritongemm.core.reference import rel_error, tolerance
    from tritongemm.grouped.api import reference_grouped_mm

    dtype = getattr(torch, spec["dtype"].removeprefix("torch."))
    sizes, M, N = spec["sizes"], spec["M"], spec["N"]
    K, G = sum(sizes), len(sizes)
    offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    a = torch.randn(M, K, device="cuda").to(dtype)
    b = (torch.randn(K, N, device="cuda") * max(K, 1) ** -0.5).to(dtype)
    poisoned = []
    if spec["poison_next"]:  # odd groups: NaN in A's columns, inf in B's rows
        for g in range(1, G, 2):
            start, end = sum(sizes[:g]), sum(sizes[: g + 1])
            a[:, start:end], b[start:end] = float("nan"), float("inf")
            poisoned += [g] if end > start else []
    a = a.T.contiguous().T  # M-major, as the weight gradient's A (the output gradient's transpose)
    c = torch.full((G, M, N), float("nan"), device="cuda", dtype=dtype)
    grouped_k_ws.plan(a, b, offs, c, num_programs=spec["num_programs"])(a, b, offs, c)
    torch.cuda.synchronize()
    expected = reference_grouped_mm(a, b, offs).double()
    clean = [g for g in range(G) if g not in poisoned]
    assert torch.isfinite(c[clean]).all(), f"{spec}: NaN or inf in the groups beside the poisoned ones"
    for g, size in enumerate(sizes):
        if size == 0:
            assert (c[g] == 0).all(), f"{spec}: empty group {g} is not zeros"
    err = rel_error(c[clean], expected[clean])
    bound = tolerance(dtype, max(sizes))
    assert err <= bound, f"{spec}: relative error {err:.3e} > {bound:.3e}"


@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA, WGMMA and setmaxnreg")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("num_programs", [None, 1, 3])
def test_grouped_k_ws(case, dtype, num_programs):
    sizes, M, N = case
    spec = dict(sizes=list(sizes), M=M, N=N, dtype=str(dtype), num_programs=num_programs, poison_next=False)
    run_isolated(spec, module="test_grouped_k_ws")


# Group sizes whose last K-step ends off a WGMMA's 16 rows (70, 33, 1: the rows up to the next 16
# are cleared) and on them (96, 16: no clearing, the MMAs stop at the group's end).
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA, WGMMA and setmaxnreg")
@pytest.mark.parametrize("sizes", [[70, 90, 0, 33, 64, 1], [96, 50, 16, 40, 128, 7]], ids=str)
def test_the_next_groups_rows_never_enter_the_sum(sizes):
    """A group's last K-step loads the next group's first rows too; its MMAs stop at the first 16
    rows past the group's end, and the rows between are cleared before them, so NaN and inf in the
    next group (every other group's) leave the groups beside them exact."""
    spec = dict(sizes=sizes, M=200, N=136, dtype="torch.bfloat16", num_programs=None, poison_next=True)
    run_isolated(spec, module="test_grouped_k_ws")


@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm_90 GPU: TMA, WGMMA and setmaxnreg")
@pytest.mark.parametrize("G, mean, a_m_major, taken", [(8, 200, True, True), (4, 130, True, True),
                                                       (16, 40, True, False), (8, 200, False, False)])  # fmt: skip
def test_grouped_mm_takes_it_for_the_weight_gradient(G, mean, a_m_major, taken, monkeypatch):
    """grouped_mm's plan takes grouped_k_ws for K groups of K_WS_FROM_MEAN_ROWS rows or more on
    average (ragged here, with an empty group) in the weight gradient's layouts, and the `tl`
    kernel elsewhere (a row-major A here); right either way. And an MoE layer's backward, whose
    weight gradient is such a product, matches the fp64 reference's."""
    import tritongemm
    from tritongemm.core.reference import rel_error, tolerance
    from tritongemm.grouped.api import reference_grouped_mm

    planned = []
    real_plan = grouped_k_ws.plan
    monkeypatch.setattr(grouped_k_ws, "plan", lambda *args, **kwargs: planned.append(1) or real_plan(*args, **kwargs))
    gen = torch.Generator().manual_seed(G * mean)
    sizes = torch.full((G,), mean)
    sizes[:4] = torch.tensor([2 * mean - 3, 0, mean + 5, mean - 5])  # ragged, one group empty
    K, M, N = int(sizes.sum()), 192, 264
    offs = sizes.cumsum(0).to(torch.int32).cuda()
    a = torch.randn(M, K + 8 - K % 8, generator=gen)[:, :K].to("cuda", torch.bfloat16)  # rows on 16 bytes
    a = a.T.contiguous().T if a_m_major else a
    b = (torch.randn(K, N, generator=gen) * mean**-0.5).to("cuda", torch.bfloat16)
    c = tritongemm.grouped_mm(a, b, offs)
    assert bool(planned) == taken
    bound = tolerance(torch.bfloat16, 2 * mean)
    assert rel_error(c, reference_grouped_mm(a, b, offs).double()) <= bound

    if taken:  # the MoE forward's backward: dW[g]^T = dC_g^T A_g, on this kernel
        planned.clear()
        x = torch.randn(K, M, generator=gen).to("cuda", torch.bfloat16)
        w = (torch.randn(G, N, M, generator=gen) * M**-0.5).to("cuda", torch.bfloat16).requires_grad_()
        grad = torch.randn(K, N, generator=gen).to("cuda", torch.bfloat16)
        tritongemm.grouped_mm(x, w.transpose(1, 2), offs).backward(grad)
        assert planned, "the weight gradient did not run on grouped_k_ws"
        expected = reference_grouped_mm(grad.T, x, offs).double()  # (G, N, M), the weight's layout
        assert rel_error(w.grad, expected) <= bound
