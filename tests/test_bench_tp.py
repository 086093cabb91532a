"""`tritongemm bench tp` without two GPUs: the smoke run over gloo, its rows and files."""

import csv

import pytest
import torch

from tritongemm import cli
from tritongemm.bench.report import csv_fields
from tritongemm.bench.tp import COLUMNS, TpRow, summary


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the smoke run is a CPU machine's: with 2 GPUs the command runs the whole suite, and on one the "
    "interpreter it falls back to is the GPU machine's Triton (3.6.0's fails with numpy >= 2.4)",
)
def test_bench_tp_smoke(tmp_path):
    assert cli.main(["bench", "tp", "--out-dir", str(tmp_path)]) == 0
    with (tmp_path / "tp-cpu.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == csv_fields(COLUMNS)
    ops, providers = ("all_gather_matmul", "matmul_reduce_scatter"), ("tritongemm", "tritongemm-nccl", "sequential")
    # torch's symm_mem ops need CUDA: refused, so not among the timed rows
    assert {(r["op"], r["provider"]) for r in rows} == {(op, p) for op in ops for p in providers}
    assert all(r["vs_sequential"] == "bitwise" for r in rows)


@pytest.mark.skipif(torch.cuda.is_available(), reason="as above: the CPU machine's smoke run")
def test_bench_tp_profile_smoke(tmp_path):
    """--profile runs one call of each path it can (torch's fused op needs CUDA: not here) on every
    rank; a CPU has no GPU activity, only each host's queueing of each call."""
    assert cli.main(["bench", "tp", "--profile", "--out-dir", str(tmp_path)]) == 0
    with (tmp_path / "tp-timeline.csv").open() as f:
        events = list(csv.DictReader(f))
    paths = ("tritongemm", "tritongemm-nccl", "sequential")
    assert {(e["rank"], e["op"], e["path"]) for e in events} == {
        (rank, op, path) for rank in "01" for op in ("all_gather_matmul", "matmul_reduce_scatter") for path in paths
    }
    assert {e["stream"] for e in events} == {"host"}
    assert (tmp_path / "tp-timeline.png").exists()


def test_summary_states_the_bars():
    def row(provider, m, ms):
        return TpRow("H100", 2, "all_gather_matmul", m, 1, 1, provider, ms, 2.0 / ms, "qkv", "eager", 0.0, "bitwise")

    rows = [row("sequential", 4096, 2.0), row("tritongemm", 4096, 1.6), row("torch-symm-mem", 4096, 1.5)]
    assert summary(rows) == [
        "eager: tritongemm vs sequential at M >= 4096: 1.250-1.250 (bar 1.3)",
        "eager: tritongemm vs torch-symm-mem: 0.938-0.938 (bar 1.0)",
    ]
