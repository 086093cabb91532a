"""The `tritongemm` command's answers: the kernels table, one line and exit status 2 for every
mistake in the arguments, the bench honouring --shapes on the CPU, the baseline's name."""

import csv
import json
import sys

import pytest
import torch

import tritongemm
from tritongemm.cli import COMMANDS, main
from tritongemm.core import registry

ON_CPU = not torch.cuda.is_available()
cpu_only = pytest.mark.skipif(not ON_CPU, reason="the interpreter's limits: a GPU runs these")


def test_kernels_table_says_where_each_kernel_runs(capsys):
    assert main(["kernels"]) == 0
    sections, family = {}, None
    for line in capsys.readouterr().out.splitlines():
        if line and not line.startswith(" ") and " " not in line:
            family = line  # a family's heading
        elif family:
            sections.setdefault(family, []).append(line)
    for k in tritongemm.kernels():
        lines = sections[k["family"]]
        name = k["name"] + (f" ({k['rung']})" if k["rung"] else "")
        (i,) = [i for i, x in enumerate(lines) if x.startswith(f"  {name} ") and "here: " in x]
        assert lines[i].endswith("here: yes" if k["available"] else "here: no"), lines[i]
        if not k["available"]:
            reason = " ".join(x.strip() for x in lines[i + 1 : i + 8] if x.startswith(" " * 6))
            assert f"not here: {k['unavailable']}" in reason
    if ON_CPU:
        gluon = [line for line in sections["matmul"] if line.startswith("  tma_")]  # rungs 4, 5, 6, 9 and 11
        assert len(gluon) == 5 and all(line.endswith("here: no") for line in gluon)


def test_kernels_table_fits_100_columns_and_names_every_family(capsys):
    assert main(["kernels"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 100
    families = {k["family"] for k in tritongemm.kernels()}
    assert {"matmul", "scaled_mm", "grouped_mm", "gated_pair", "distributed"} <= families
    assert families <= set(lines)


def test_kernels_json_is_the_list(capsys):
    assert main(["kernels", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == tritongemm.kernels()


# (command line, what the one line of stderr must name)
MISTAKES = [
    ("", "command"),
    ("frob", "argument command"),
    ("bench", "--shapes"),
    ("bench fast", "argument suite"),
    ("bench --shapes 1,2", "argument --shapes"),
    ("bench --shapes 0,4,4", "argument --shapes"),
    ("bench --shapes 8,8,8 --dtypes float64", "argument --dtypes"),
    ("bench --shapes 8,8,8 --dtypes fp16", "fp16 is spelled float16"),
    ("bench --shapes 8,8,8 --kernels fastest", "argument --kernels"),
    ("bench --shapes 8,8,8 --kernels fastest", "--kernels"),
    ("bench --shapes 8,8,8 --layout xy", "argument --layout"),
    ("bench ladder --layout nt", "--layout"),
    ("bench overhead --shapes 8,8,8", "--shapes"),
    ("bench overhead --timing eager", "--timing"),
    ("bench ladder --timing fast", "argument --timing"),
    ("bench --markdown missing.csv", "argument --markdown"),
    ("schedule 0 64", "argument M:"),
    ("schedule 64 64 --block-m 100", "argument --block-m"),
    ("schedule 64 64 --kernel fastest", "argument --kernel"),
    ("schedule 64 64 --sms 0", "argument --sms"),
    ("l2", "M N K"),
    ("l2 64 64", "M N K"),
    ("l2 64 64 64 --ncu .", "--ncu"),
    ("l2 64 64 64 --kernels naive,fastest", "argument --kernels"),
    ("l2 64 64 64 --group-sizes 1,0", "argument --group-sizes"),
    ("l2 64 64 64 --block 16,16", "argument --block"),
    ("l2 64 64 64 --l2-mb x", "argument --l2-mb"),
    ("l2 --ncu /nonexistent", "argument --ncu"),
    ("explain 40 36 50 --program 9", "--program"),
    ("explain 40 36 50 --program -1", "argument --program"),
    ("explain 40 36 50 --kernel persistent --sms 4 --program 1 --step 5", "--step"),
    ("explain 40 36 50 --strides 1,2,3", "argument --strides"),
    ("explain 40 36 50 --block 16,16,x", "argument --block"),
    ("predict", "M N K"),
    ("predict 64 64", "M N K"),
    ("predict 64 64 64 --kernel fastest", "argument --kernel"),
    ("predict 64 64 64 --dtype fp8", "argument --dtype"),
    ("predict --calibrate missing.csv", "argument --calibrate"),
    ("predict 64 64 64 --write out.json", "--write"),
    ("predict 64 64 64 --constants /nonexistent.json", "--constants /nonexistent.json: no such file"),
    ("predict --compare pyproject.toml", "--compare found no timed rows"),
    # the tools' refused rungs: by name, and why
    ("schedule 64 64 --kernel split_k", "argument --kernel: kernel 'split_k' splits K across programs"),
    ("explain 40 36 50 --kernel stream_k", "argument --kernel: kernel 'stream_k' splits K across programs"),
    ("l2 64 64 64 --kernels naive,split_tail", "argument --kernels: kernel 'split_tail' splits K across programs"),
    ("predict 64 64 64 --kernel swap_ab", "kernel 'swap_ab' splits K across programs where its tiles are too few"),
    ("schedule 64 64 --kernel odd_width --block-n 128", "odd_width: BLOCK_N must be an odd width"),
    ("explain 40 36 50 --kernel odd_width --block 16,32,16", "BLOCK_N=32"),
    ("l2 64 64 64 --kernels odd_width --block 64,128,64", "odd_width: BLOCK_N must be an odd width"),
    ("explain-choice 64 64 64 --gpu a100", "argument --gpu"),
    ("explain-choice 0 64 64", "argument M"),
]
CPU_MISTAKES = [
    ("bench --shapes 128,128,128", "--shapes 128x128x128 is too large for the Triton interpreter"),
    ("bench --shapes 16,16,16 --dtypes bfloat16", "--dtypes bfloat16 does not run on the CPU"),
    ("bench --shapes 16,16,16 --kernels tma_pipelined", "--kernels tma_pipelined does not run here"),
    ("bench ladder --dtypes float16,bfloat16", "--dtypes bfloat16"),
]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_says_what_it_does(command, capsys):
    """`tritongemm CMD --help` starts with its usage and a description, the line the list of
    commands shows for it."""
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    usage, description = capsys.readouterr().out.split("\n\n")[:2]
    assert usage.startswith(f"usage: tritongemm {command}")
    assert " ".join(description.split()).lower() == COMMANDS[command].help.lower() + "."


def test_the_list_of_commands_names_each_with_its_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(f"{name} {command.help}" in out for name, command in COMMANDS.items())


@pytest.mark.parametrize("module", ["tritongemm", "tritongemm.cli"])
def test_python_dash_m_runs_the_cli(module):
    """`python -m tritongemm` and `python -m tritongemm.cli` both run it (the second once did
    nothing, silently, and said so by exit status 0)."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", module, "kernels", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [row["name"] for row in json.loads(done.stdout)] == [k["name"] for k in tritongemm.kernels()]


@pytest.mark.parametrize(
    "argv, names", MISTAKES + [pytest.param(*m, marks=cpu_only) for m in CPU_MISTAKES], ids=lambda x: str(x)
)
def test_a_mistake_gets_one_line_and_status_2(argv, names, capsys):
    assert main(argv.split()) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing ran
    (line,) = err.splitlines()
    assert line.startswith("tritongemm") and ": error: " in line and names in line


def test_markdown_of_another_suites_csv_names_what_it_lacks(tmp_path, capsys):
    path = tmp_path / "tp.csv"
    path.write_text("device,gpus,op,m,n,k,provider,ms,speedup_vs_sequential\n")
    assert main(["bench", "--markdown", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "lacks dtype, layout, kernel, config, tflops, ratio_to_cublas, status" in line and "gpus" in line


def test_an_error_during_the_work_keeps_its_traceback(monkeypatch):
    import tritongemm.bench

    def fails(*args, **kwargs):
        raise ValueError("a bug, not a mistake in the arguments")

    monkeypatch.setattr(tritongemm.bench, "run_bench", fails)
    with pytest.raises(ValueError, match="a bug"):
        main(["bench", "--shapes", "16,16,16"])


@cpu_only
def test_bench_runs_the_given_shapes_on_the_cpu(tmp_path, capsys):
    argv = ["bench", "--shapes", "16,16,16", "--dtypes", "float16", "--kernels", "naive", "--out-dir", str(tmp_path)]
    assert main(argv + ["--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "running these shapes under the Triton interpreter" in out
    assert "16x16x16 torch.matmul (CPU)" in out and "vs cuBLAS" not in out
    with (tmp_path / "custom-cpu.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["m"], r["n"], r["k"], r["dtype"], r["kernel"], r["status"]) for r in rows] == [
        ("16", "16", "16", "float16", "cublas", "ok"),  # the data keeps "cublas": the ratios key on it
        ("16", "16", "16", "float16", "naive", "ok"),
    ]


@cpu_only
def test_bench_without_shapes_runs_the_smoke_test_and_says_so(capsys, monkeypatch):
    import tritongemm.bench

    monkeypatch.setattr(tritongemm.bench, "CPU_SMOKE_SHAPES", [(16, 16, 16)])
    assert main(["bench", "ladder", "--dtypes", "float32", "--kernels", "naive", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "smoke test on tiny shapes instead of the ladder suite" in out and "16x16x16 naive" in out


@cpu_only
def test_demo_names_what_it_compared(capsys, monkeypatch):
    import tritongemm.bench

    monkeypatch.setattr(tritongemm.bench, "CPU_SMOKE_SHAPES", [(16, 16, 16)])
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "16x16x16 torch.matmul (CPU)" in out and "cublas" not in out.lower()
    kernels = [k for k in registry.all_kernels("matmul") if k.interpretable and not k.experimental]
    runs = 2 * (1 + len(kernels))  # fp16 and fp32: torch, then each kernel
    assert out.splitlines()[-1] == f"{runs} of {runs} runs matched the fp64 reference."


@cpu_only
def test_bench_configs_run_every_kernel_with_each(tmp_path):
    configs = "16x16x16 g1 w4 s1;32x32x32 g1 w4 s1"
    argv = ["bench", "--shapes", "32,32,32", "--dtypes", "float32", "--kernels", "grouped", "--configs", configs]
    assert main([*argv, "--out-dir", str(tmp_path), "--no-plot"]) == 0
    rows = list(csv.DictReader((tmp_path / "custom-cpu.csv").open()))
    assert [r["config"] for r in rows if r["kernel"] == "grouped"] == configs.split(";")
    assert main(["bench", "--shapes", "32,32,32", "--configs", "32x32"]) == 2  # not a config label


def test_kernels_table_marks_the_experimental_rungs(capsys):
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    assert "stream_k (10)" in out and "experimental (in auto only by a measured rule)" in out
