"""`tritongemm tune` and `tritongemm explain-choice` on the CPU: the interpreter's smoke problems,
a table written, read back and resumed (tune.py, dispatch_table.py). On a GPU the same commands
time the real candidates; what they find is for results/ and the shipped table, not for tests."""

import json

import pytest
import torch

from tritongemm import cli, dispatch_table, tune

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="tunes the CPU smoke problems")


def test_tune_writes_a_table_and_resumes_it(tmp_path, capsys):
    path = tmp_path / "table.json"
    assert cli.main(["tune", "--out", str(path)]) == 0
    table = json.loads(path.read_text())
    assert table["format"] == dispatch_table.FORMAT and table["device"] == "cpu (Triton interpreter)"
    assert {(e["layout"], e["m"], e["n"], e["k"]) for e in table["entries"]} == {("nn", 16, 16, 16), ("nt", 64, 32, 32)}
    for entry in table["entries"]:
        assert entry["kernel"] in ("naive", "grouped", "persistent") and entry["correct"] == entry["tried"] == 3
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
    assert cli.main(["explain-choice", "64", "48", "100", "--layout", "nt"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("64 x 48 x 100 float16 on cpu: persistent, ") and "because the first of" in out
    assert cli.main(["explain-choice", "64", "48", "100", "--dtype", "bfloat16"]) == 2
    assert "computes bfloat16 dots wrongly" in capsys.readouterr().err


def test_the_candidates_on_a_gpu_cover_each_kernels_configs():
    from tritongemm.hopper import TILES

    assert tune.candidates("tma_persistent_pipelined", torch.float16, on_gpu=True) == (None, *TILES)
    ladder = tune.candidates("grouped", torch.bfloat16, on_gpu=True)
    assert ladder[0] is None and len(set(ladder)) == len(ladder) >= 6
    assert tune.candidates("grouped", torch.float32, on_gpu=True)[0] is None
    assert len({p.dtype for p in tune.default_problems()}) == 2 and len(tune.default_problems()) > 50
