"""`tritongemm tune` and `tritongemm explain-choice` on the CPU: the interpreter's smoke problems,
a table written, read back and resumed (dispatch/tune.py, dispatch/table.py). On a GPU the same commands
time the real candidates; what they find is for results/ and the shipped table, not for tests."""

import json

import pytest
import torch

from tritongemm import cli, dispatch
from tritongemm.bench.suites import Problem
from tritongemm.core import registry
from tritongemm.dispatch import table as dispatch_table
from tritongemm.dispatch import tune

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="tunes the CPU smoke problems")


def test_tune_writes_a_table_and_resumes_it(tmp_path, capsys):
    path = tmp_path / "table.json"
    assert cli.main(["tune", "--out", str(path)]) == 0
    table = json.loads(path.read_text())
    assert table["format"] == dispatch_table.FORMAT and table["device"] == "cpu (Triton interpreter)"
    assert {(e["layout"], e["m"], e["n"], e["k"]) for e in table["entries"]} == {("nn", 16, 16, 16), ("nt", 64, 32, 32)}
    interpreted = [k.name for k in registry.all_kernels("matmul") if k.interpretable and not k.experimental]
    for entry in table["entries"]:
        assert entry["kernel"] in interpreted and entry["correct"] == entry["tried"] == len(interpreted)
        assert entry["ms"] > 0 and entry["cublas_ms"] > 0
    assert "2 buckets measured, 0 already in the table" in capsys.readouterr().out
    assert cli.main(["tune", "--out", str(path)]) == 0  # resumed: nothing left to measure
    assert "0 buckets measured, 2 already in the table" in capsys.readouterr().out
    assert cli.main(["tune", "--out", str(path), "--restart", "--shapes", "8,8,8", "--dtypes", "float32"]) == 0
    assert [e["m"] for e in json.loads(path.read_text())["entries"]] == [8]


def test_a_table_of_another_device_is_not_resumed(tmp_path, capsys):
    path = tmp_path / "table.json"
    dispatch_table.Table("NVIDIA H100 80GB HBM3", "2.11", "3.6").save(path)
    assert cli.main(["tune", "--out", str(path), "--shapes", "8,8,8", "--dtypes", "float32"]) == 0
    assert json.loads(path.read_text())["device"] == "cpu (Triton interpreter)"


def test_explain_choice(capsys):
    assert cli.main(["explain-choice", "200", "48", "100", "--layout", "nt"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("200 x 48 x 100 float16 on cpu: grouped, ") and "because the first of" in out
    assert cli.main(["explain-choice", "64", "48", "100", "--dtype", "bfloat16"]) == 2
    assert "computes bfloat16 dots wrongly" in capsys.readouterr().err


# (explain-choice's arguments with --gpu, what chose: "table" (the shipped H100 table) or "rules")
MODELLED = [
    ("4096 4096 4096 --dtype bfloat16 --gpu h100", "rules"),
    ("777 4096 4096 --dtype bfloat16 --gpu h100", "table"),  # results/h100/auto.csv's bucket
    ("8192 8192 512 --dtype bfloat16 --gpu h100", "rules"),  # short K
    ("512 2560 8192 --dtype float16 --layout nt --gpu h100", "rules"),  # a few waves: odd widths
    ("777 4096 4096 --dtype bfloat16 --gpu h200", "rules"),  # buckets the H200's table has not measured yet
    ("4096 4096 4096 --gpu h200", "rules"),
    ("128 14336 4096 --dtype bfloat16 --layout nt --gpu h200", "table"),  # one it has
]


@pytest.mark.parametrize("argv, chose", MODELLED)
def test_explain_choice_on_a_modelled_gpu(argv, chose, capsys, monkeypatch, tmp_path):
    """On a CPU: the GPU's choice, a Gluon rung, from its shipped table or the rules, saying which."""
    from tritongemm.cli.tune import GPUS
    from tritongemm.core import device_info

    monkeypatch.setenv("TRITONGEMM_CACHE_DIR", str(tmp_path))  # no table tuned here
    dispatch_table.reload()
    properties = device_info._properties
    assert cli.main(["explain-choice", *argv.split()]) == 0
    assert device_info._properties is properties  # the model's facts are gone after the command
    first, because, *note = capsys.readouterr().out.splitlines()
    gpu = GPUS[argv.split()[-1]]
    assert f" on {gpu['name']} (modelled: sm_90, 132 SMs, {gpu['l2_bytes'] >> 20} MiB L2): " in first
    kernel = first.split("): ")[1].split(",")[0]
    assert registry.get(kernel).tma  # a Gluon rung, as on the GPU
    shipped = dispatch_table.shipped_table_path(gpu["name"]).name
    if chose == "table":
        assert because.startswith("  because table ") and shipped in because and not note
    else:
        assert because.startswith("  because the first of ")
        (note,) = note
        assert note.endswith(": the rules chose") and f"{shipped} has no entry for bucket" in note
    dispatch_table.reload()


# (explain-choice's arguments for another family, the kernel its "auto" takes, a phrase of its why)
FAMILY_CHOICES = [
    ("16 14336 4096 --family scaled_mm --recipe tensor --gpu h200", "fp8_swap_ab", "M <= 16 on Hopper"),
    ("128 4096 4096 --family scaled_mm --gpu h100", "fp8_tma", "fills its waves best"),
    ("4096 4096 4096 --family scaled_mm --recipe block --gpu h100", "fp8_block", "block-scaled"),
    ("4096 4096 4096 --family scaled_mm --gpu h200", "fp8_ws", "warp-specialized"),
    ("100 64 64 --family scaled_mm", "fp8_grouped", "not a CUDA device"),
    ("8192 2816 2048 --family grouped_mm --groups 8 --dtype bfloat16 --gpu h100", "grouped_mm_ws", "1024 rows a group"),
    ("64 2816 2048 --family grouped_mm --groups 8 --dtype bfloat16 --gpu h100", "grouped_mm_rows", "8 rows a group"),
]


def test_explain_choice_says_where_block_scales_run_on_two_cta_clusters(capsys, monkeypatch):
    """Where the installed Triton multicasts (3.8 on), fp8_block's wide tile from CLUSTER_MIN_M rows
    runs on clusters of two CTAs: the why says so; below that M, and without multicast, it doesn't."""
    from tritongemm.fp8 import block as fp8_block

    for multicast, M, says in ((True, 4096, True), (True, 512, False), (False, 4096, False)):
        monkeypatch.setattr(fp8_block, "CLUSTER_MULTICAST", multicast)
        argv = f"{M} 4096 4096 --family scaled_mm --recipe block --gpu h200"
        assert cli.main(["explain-choice", *argv.split()]) == 0
        because = capsys.readouterr().out.splitlines()[1]
        assert ("clusters of two CTAs" in because) == says, (multicast, M, because)


@pytest.mark.parametrize("argv, kernel, why", FAMILY_CHOICES)
def test_explain_choice_of_the_other_families(argv, kernel, why, capsys):
    """scaled_mm's and grouped_mm's "auto", explained on any machine: the kernel (a row of the
    registry's family) and the rule that took it."""
    assert cli.main(["explain-choice", *argv.split()]) == 0
    first, because = capsys.readouterr().out.splitlines()
    family = argv.split("--family ")[1].split()[0]
    assert first.split(": ")[1].split(",")[0] == kernel and registry.get(kernel, family)
    assert because.startswith("  because ") and why in because


def test_the_candidates_on_a_gpu_cover_each_kernels_configs(monkeypatch):
    from tritongemm.core import device_info
    from tritongemm.core.registry import get
    from tritongemm.dispatch.tiles import TILES

    monkeypatch.setattr(device_info, "_properties", lambda index: ((9, 0), 132, "NVIDIA H100 80GB HBM3", 50 << 20))
    gpu = torch.device("cuda", 0)  # what the kernels' default configs ask of it is answered above
    problem = Problem(4096, 4096, 4096, "bfloat16")
    hopper = tune.candidates("tma_persistent_pipelined", problem, gpu)
    assert set(hopper) == set(TILES) and len(hopper) == len(TILES)  # the default is one of the tiles
    ladder = tune.candidates("grouped", problem, gpu)
    assert ladder[0] == dispatch.default_config(get("grouped"), torch.bfloat16, 4096, 4096, 4096, gpu)
    assert len(set(ladder)) == len(ladder) >= 6
    assert len(tune.candidates("naive", problem, gpu)) == 1
    assert len({p.dtype for p in tune.default_problems()}) == 2 and len(tune.default_problems()) > 50
    assert tune.candidates("swap_ab", problem, gpu) == ()  # not its regime: M > dispatch.SKINNY_M


def test_skinny_problems_try_swap_ab_s_tiles_and_the_others_defaults(monkeypatch):
    from tritongemm.core import device_info

    monkeypatch.setattr(device_info, "_properties", lambda index: ((9, 0), 132, "NVIDIA H100 80GB HBM3", 50 << 20))
    gpu = torch.device("cuda", 0)
    decode = Problem(1, 4096, 14336, "bfloat16", "nt")
    swapped = tune.candidates("swap_ab", decode, gpu)
    assert len(set(swapped)) == len(swapped) >= 5 and {c.split_k for c in swapped} == {0, 1}
    assert all(c.BLOCK_M == 16 for c in swapped)  # the narrowest token tile covers one token
    assert len(tune.candidates("split_k", decode, gpu)) == 1
    assert len(tune.candidates("grouped", decode, gpu)) == 2  # its default, and swap_ab's tile unswapped
    for never_won in ("naive", "persistent", "tma_pipelined", "tma_persistent", "tma_persistent_pipelined"):
        assert tune.candidates(never_won, decode, gpu) == ()


def test_deep_rings_are_tried_where_tiles_are_few(monkeypatch):
    from tritongemm.core import device_info
    from tritongemm.dispatch.tiles import DEEP_RING_TILES, TILES

    monkeypatch.setattr(device_info, "_properties", lambda index: ((9, 0), 132, "NVIDIA H100 80GB HBM3", 50 << 20))
    gpu = torch.device("cuda", 0)
    batch = Problem(128, 4096, 4096, "bfloat16", "nt")  # skinny, but enough tokens for 64-row tiles
    assert set(tune.candidates(tune.SKINNY_TMA, batch, gpu)) >= set(DEEP_RING_TILES)
    assert tune.candidates("tma_persistent", batch, gpu) == ()  # one Gluon rung is enough there
    odd = Problem(1000, 1000, 1000, "float16")  # 64 tiles of 128 x 128: under two waves
    assert set(tune.candidates("tma_warp_specialized", odd, gpu)) >= set(TILES[1:]) | set(DEEP_RING_TILES)
    for many in (Problem(4096, 4096, 4096, "float16"), Problem(3000, 5000, 1000, "float16")):
        assert not set(tune.candidates("tma_persistent_pipelined", many, gpu)) & set(DEEP_RING_TILES)


def test_a_time_budget_stops_between_problems(tmp_path, capsys):
    problems = (Problem(16, 16, 16, "float32"), Problem(8, 8, 8, "float32"))
    tune.tune(problems, path=tmp_path / "t.json", minutes=0, progress=False)
    assert "stopped at the 0-minute budget with 2 problems left" in capsys.readouterr().out


def test_max_m_and_the_rows_log(tmp_path, capsys):
    table, rows = tmp_path / "t.json", tmp_path / "rows.csv"
    args = ["tune", "--out", str(table), "--shapes", "8,8,8;300,16,16", "--dtypes", "float32", "--max-m", "16"]
    assert cli.main([*args, "--rows", str(rows)]) == 0
    assert [e["m"] for e in json.loads(table.read_text())["entries"]] == [8]
    logged = rows.read_text().splitlines()
    assert logged[0].startswith("device,dtype,layout,m,n,k,kernel,config")
    assert {line.split(",")[6] for line in logged[1:]} >= {"cublas", "swap_ab", "grouped"}


def test_an_experimental_kernel_is_left_out_of_the_default_lists(monkeypatch):
    import dataclasses

    from tritongemm.bench.measure import runnable_kernels
    from tritongemm.core import registry

    grouped = registry.get("grouped")
    monkeypatch.setitem(registry._BY_KEY, ("matmul", "grouped"), dataclasses.replace(grouped, experimental=True))
    assert "grouped" not in runnable_kernels(torch.float32, "cpu")  # tune's and the benchmarks' default
    assert runnable_kernels(torch.float32, "cpu", ["grouped"]) == ["grouped"]  # named, it runs


def test_the_rules_choice_stays_unless_beaten_by_more_than_the_noise():
    """A table entry decides a bucket on one timing: within RULES_MARGIN the rules' choice stays."""
    from types import SimpleNamespace

    def row(kernel, config, ms):
        return SimpleNamespace(kernel=kernel, config=config, ms=ms)

    rules = ("tma_persistent_pipelined", "128x256x64 g8 w8 s4")
    ruled = row(*rules, 1.00)
    close, far = row("tma_pipelined", "128x256x64 g8 w8 s4", 0.98), row("tma_persistent", "128x128x64 g8 w4 s4", 0.90)
    assert tune.winner([ruled, close], rules) == (ruled, ruled)  # 2% faster: noise
    assert tune.winner([ruled, close, far], rules) == (far, ruled)  # 10% faster: the table's
    assert tune.winner([close, far], rules) == (far, None)  # the rules' candidate failed its check
    assert 0 < tune.RULES_MARGIN < 0.05


def test_a_tuned_entry_records_the_rules_time(tmp_path):
    path = tmp_path / "table.json"
    assert cli.main(["tune", "--out", str(path), "--shapes", "8,8,8", "--dtypes", "float32"]) == 0
    (entry,) = json.loads(path.read_text())["entries"]
    assert entry["rules_ms"] > 0 and entry["ms"] <= entry["rules_ms"]


def _row(kernel, config, ms):
    from types import SimpleNamespace

    return SimpleNamespace(kernel=kernel, config=config, ms=ms)


def test_the_eager_check_keeps_a_winner_only_if_it_is_not_slower_eagerly():
    best, rules = _row("tma_persistent_pipelined", "64x64x64 g8 w4 s12", 0.016), _row("swap_ab", "64x64x128", 0.017)
    times = lambda ours, theirs: {tune.key(best): _row(best.kernel, best.config, ours),  # noqa: E731
                                  tune.key(rules): _row(rules.kernel, rules.config, theirs)}  # fmt: skip
    assert tune.eager_confirms(times(0.022, 0.022), best, rules)
    assert tune.eager_confirms(times(0.0226, 0.022), best, rules)  # within RULES_MARGIN
    assert not tune.eager_confirms(times(0.026, 0.0225), best, rules)  # 128 x 4096 x 4096's case
    assert not tune.eager_confirms(times(None, 0.022), best, rules)  # failed eagerly
    assert tune.eager_confirms(times(0.03, None), best, rules)  # nothing to hold it against


@pytest.mark.parametrize("confirmed", [True, False])
def test_a_winner_that_is_not_the_rules_choice_is_timed_eagerly(tmp_path, monkeypatch, confirmed):
    """Whatever wins kernel-only, the entry records the eager check; if the check fails, the rules'
    choice goes into the table and the loser is named."""
    rules_of = {}

    def the_other(timed, rules):  # a kernel-only winner other than the rules' choice
        ruled = next(r for r in timed if (r.kernel, r.config) == rules)
        rules_of["rules"] = ruled
        return next(r for r in timed if r is not ruled), ruled

    monkeypatch.setattr(tune, "winner", the_other)
    monkeypatch.setattr(tune, "eager_confirms", lambda eager, best, rules: confirmed)
    path, rows = tmp_path / "t.json", tmp_path / "rows.csv"
    tune.tune((Problem(16, 16, 16, "float32"),), path=path, progress=False, rows_path=rows)
    (entry,) = json.loads(path.read_text())["entries"]
    assert entry["eager_ms"] > 0 and entry["rules_eager_ms"] > 0
    ruled = rules_of["rules"]
    assert ((entry["kernel"], entry["config"]) == (ruled.kernel, ruled.config)) is not confirmed
    assert ("rejected" in entry) is not confirmed
    assert "eager" in rows.read_text()  # the eager check's rows are kept with the others
