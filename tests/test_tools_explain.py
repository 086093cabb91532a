"""tools/explain.py against the real kernels: the elements the numpy rewrite says each program
loads and stores are the ones the `triton.language` kernel loads and stores (it runs under the
Triton interpreter on a CPU, on the GPU otherwise). C is poisoned with NaN, padding included, so a
store the rewrite misses, or one it invents, shows up as a NaN mismatch."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from cases import DEVICE

from tritongemm.cli import main
from tritongemm.core.config import MatmulConfig
from tritongemm.ladder import grouped, naive, persistent, swap_ab
from tritongemm.primitives import tiling as tile_order
from tritongemm.primitives.tl import host as _host
from tritongemm.tools import explain, launch

LAUNCHERS = {
    "naive": naive.launch,
    "grouped": grouped.launch,
    "persistent": persistent.launch,
    # K whole (split_k=1), as explain shows it; no trace of who computed which tile
    "swap_ab": lambda a, b, c, config, trace=None: swap_ab.launch(a, b, c, config.with_(split_k=1)),
}


@dataclass(frozen=True)
class Case:
    kernel: str
    M: int
    N: int
    K: int
    layout: str  # "nn", "tn" (a transposed), "nt" (b transposed), "padded" (leading dims + 8)
    group: int = 2

    def __str__(self):
        return f"{self.kernel}-{self.M}x{self.N}x{self.K}-{self.layout}-g{self.group}"


CASES = [
    Case("naive", 40, 36, 50, "nn"),  # ragged M, N and K
    Case("grouped", 40, 36, 50, "tn", group=2),
    Case("grouped", 16, 80, 16, "nn", group=8),  # one row of tiles, one K step
    Case("persistent", 40, 36, 50, "nt", group=2),  # clamped rows / columns at the edges
    Case("persistent", 33, 47, 20, "padded", group=3),
    Case("persistent", 64, 64, 32, "nn", group=1),  # 16 tiles on 4 programs: 4 steps each
    Case("swap_ab", 40, 36, 50, "nt"),  # a weight's view, as swap_ab's callers pass it
    Case("swap_ab", 33, 47, 20, "padded"),
]
CONFIG = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=1)


def _operand(rows, cols, transposed, padded, gen):
    """(storage as a flat float64 array, a torch view of it with the given layout). Small integers:
    every sum is exact in fp32, so kernel and rewrite must agree bit for bit."""
    outer, inner = (cols, rows) if transposed else (rows, cols)
    ld = inner + (8 if padded else 0)
    storage = torch.randint(-3, 4, (outer * ld,), generator=gen).to(torch.float32)
    # The view is made on the device: `.to(device)` of a padded view would make it contiguous.
    view = torch.as_strided(storage.to(DEVICE), (outer, inner), (ld, 1))
    return storage.numpy().astype(np.float64), view.T if transposed else view


def _run(case: Case, trace=None):
    gen = torch.Generator().manual_seed(len(str(case)))
    a_flat, a = _operand(case.M, case.K, case.layout == "tn", case.layout == "padded", gen)
    b_flat, b = _operand(case.K, case.N, case.layout == "nt", case.layout == "padded", gen)
    c_storage = torch.full((case.M * (case.N + 5),), float("nan"), dtype=torch.float32, device=DEVICE)
    c = torch.as_strided(c_storage, (case.M, case.N), (case.N + 5, 1))  # 5 poisoned columns of padding
    config = MatmulConfig(GROUP_SIZE_M=case.group, **CONFIG)
    LAUNCHERS[case.kernel](a, b, c, config, trace=trace)
    return a_flat, b_flat, c_storage.cpu().numpy().astype(np.float64), explain.Operands.of(a, b, c), config


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rewrite_loads_and_stores_what_the_kernel_does(case):
    a_flat, b_flat, c_kernel, ops, config = _run(case)
    c_rewrite = np.full_like(c_kernel, np.nan)
    num_programs = _host.sm_count(DEVICE)
    programs = launch.plan(case.kernel, case.M, case.N, config, num_sms=num_programs).schedule.num_programs
    for p in range(programs):
        explain.emulate(explain.explain(case.kernel, ops, config, p, num_programs), a_flat, b_flat, c_rewrite)
    np.testing.assert_array_equal(c_rewrite, c_kernel)  # same values, same NaNs left


@pytest.mark.parametrize("case", [c for c in CASES if c.kernel != "swap_ab"], ids=str)
def test_each_program_stores_the_tiles_the_kernel_gave_it(case):
    num_pid_m, num_pid_n = tile_order.cdiv(case.M, 16), tile_order.cdiv(case.N, 16)
    trace = torch.full((num_pid_m, num_pid_n, 2), -1, dtype=torch.int32, device=DEVICE)
    *_, ops, config = _run(case, trace)
    recorded = trace.cpu().numpy()
    num_programs = _host.sm_count(DEVICE)
    seen = np.zeros((num_pid_m, num_pid_n), dtype=int)
    for p in range(int(recorded[..., 0].max()) + 1):
        for w in explain.explain(case.kernel, ops, config, p, num_programs):
            assert tuple(recorded[w.pid_m, w.pid_n]) == (p, w.step)
            rows, cols = np.nonzero(w.c_mask)
            assert set(w.c_offsets[rows, cols]) == {
                (w.offs_m[r]) * ops.stride_cm + w.offs_n[c] * ops.stride_cn for r, c in zip(rows, cols)
            }
            seen[w.pid_m, w.pid_n] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize(
    "kernel", ["tma_pipelined", "tma_persistent", "tma_persistent_pipelined", "tma_ping_pong", "odd_width"]
)
@pytest.mark.parametrize("scheduler", ["grouped", "chunked"])
def test_tma_boxes_cover_c_once_and_compute_a_times_b(kernel, scheduler):
    """No interpreter for Gluon: check the rewrite against numpy's product instead."""
    rng = np.random.default_rng(0)
    M, N, K = 45, 70, 40
    a, b = rng.integers(-3, 4, (M, K)).astype(float), rng.integers(-3, 4, (N, K)).astype(float).T  # b: nt view
    ops = explain.Operands(M, N, K, K, 1, 1, K, N, 1)
    width = 48 if kernel == "odd_width" else 32  # rung 13's B boxes of 32 and 16 columns side by side
    config = MatmulConfig(BLOCK_M=16, BLOCK_N=width, BLOCK_K=16, GROUP_SIZE_M=2, scheduler=scheduler)
    c = np.full(M * N, np.nan)
    programs = launch.plan(kernel, M, N, config, num_sms=5).schedule.num_programs
    stores = 0
    for p in range(programs):
        works = explain.explain(kernel, ops, config, p, num_programs=5)
        stores += sum(int(w.c_mask.sum()) for w in works)
        explain.emulate(works, a.ravel(), b.T.ravel(), c)
    assert stores == M * N
    np.testing.assert_array_equal(c.reshape(M, N), a @ b)


@pytest.mark.parametrize("kernel", ["naive", "persistent", "tma_persistent"])
def test_printed_rewrite_runs_and_gives_the_same_arrays(kernel):
    ops = explain.Operands.contiguous(40, 36, 50, "tn")
    config = MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_SIZE_M=2)
    for work in explain.explain(kernel, ops, config, program=1, num_programs=4):
        scope: dict = {}
        exec(explain.numpy_rewrite(work, ops, config), scope)
        for i, st in enumerate(work.steps):
            np.testing.assert_array_equal(scope["a_offsets"][i], st.a_offsets)
            np.testing.assert_array_equal(scope["a_masks"][i], st.a_mask)
            np.testing.assert_array_equal(scope["b_offsets"][i], st.b_offsets)
            np.testing.assert_array_equal(scope["b_masks"][i], st.b_mask)
        np.testing.assert_array_equal(scope["c_ptrs"], work.c_offsets)
        np.testing.assert_array_equal(scope["c_mask"], work.c_mask)


# (layout, strides am, ak, bk, bn, cm, cn) for a (30, 20) @ (20, 10)
LAYOUTS = [
    ("nn", (20, 1, 10, 1, 10, 1)),
    ("tn", (1, 30, 10, 1, 10, 1)),
    ("nt", (20, 1, 1, 20, 10, 1)),
    ("tt", (1, 30, 1, 20, 10, 1)),
]


@pytest.mark.parametrize("layout, strides", LAYOUTS)
def test_contiguous_strides_match_torch(layout, strides):
    a = torch.empty(20, 30).T if layout[0] == "t" else torch.empty(30, 20)
    b = torch.empty(10, 20).T if layout[1] == "t" else torch.empty(20, 10)
    assert explain.Operands.of(a, b, torch.empty(30, 10)) == explain.Operands(30, 10, 20, *strides)
    assert explain.Operands.contiguous(30, 10, 20, layout) == explain.Operands(30, 10, 20, *strides)


def test_explain_command(capsys):
    argv = "explain 40 36 50 --kernel persistent --program 1 --sms 4 --step 1 --group-size-m 2".split()
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "offs_am = np.where(offs_m < M, offs_m, 0)" in text
    assert "k step 3: A rows 16..31, cols 48..49 (32 loaded, 224 masked)" in text
    assert "store: C rows 16..31, cols 32..35 (64 elements stored, 192 masked)" in text


def test_odd_width_command_takes_its_tile_and_says_b_is_two_boxes(capsys):
    assert main("explain 40 200 50 --kernel odd_width --sms 4".split()) == 0
    text = capsys.readouterr().out
    assert "tiles 16x96x16" in text and "# B's box is two, side by side" in text
    assert "store: C rows 0..15, cols 0..95 (1536 elements stored, 0 masked)" in text


def test_swap_ab_command_explains_k_whole(capsys):
    assert main("explain 40 36 50 --kernel swap_ab --program 3".split()) == 0
    text = capsys.readouterr().out
    assert "swap_ab (column_major order), program 3 = program_id(0) 0, program_id(1) 1" in text
    assert "loads these blocks transposed, for C.T's tile" in text


@pytest.mark.parametrize("kernel", ["split_k", "stream_k", "split_tail"])
def test_a_rung_that_splits_k_is_refused_with_why(kernel):
    ops = explain.Operands.contiguous(40, 36, 50)
    with pytest.raises(ValueError, match=f"explain: kernel '{kernel}' splits K across programs.*does not show"):
        explain.explain(kernel, ops, MatmulConfig(BLOCK_M=16, BLOCK_N=16), program=0)


def test_program_out_of_range_is_explained():
    ops = explain.Operands.contiguous(40, 36, 50)
    with pytest.raises(ValueError, match=r"naive launches programs 0..8 here, but got program=9"):
        explain.explain("naive", ops, MatmulConfig(BLOCK_M=16, BLOCK_N=16), program=9)
