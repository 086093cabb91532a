"""`tritongemm bench fp8`: the problems, the check before timing, torch's refusals recorded, the
files. On the CPU one tiny problem per recipe under the interpreter (torch's CPU _scaled_mm takes
some recipes and refuses others: either is a row)."""

from __future__ import annotations

import csv

import pytest
import torch
from cases import ON_GPU

from tritongemm import cli
from tritongemm.bench import fp8
from tritongemm.bench.report import csv_fields
from tritongemm.core import device_info, registry


def test_the_suite_covers_every_recipe_on_the_llm_shapes_and_8192_cubed():
    problems, note = fp8.plan_problems(None, on_gpu=True)
    assert {p.recipe for p in problems} == set(fp8.RECIPES) and note == ""
    assert {(p.N, p.K) for p in problems} >= set(fp8.WEIGHTS)
    assert min(p.M for p in problems) <= 16 and fp8.Fp8Problem("block", 8192, 8192, 8192) in problems


@pytest.mark.skipif(ON_GPU, reason="the CPU's smoke run")
def test_a_cpu_run_checks_times_and_writes_every_recipe(tmp_path):
    rows = fp8.run_fp8(out_dir=tmp_path, plot=False, rounds=1)
    assert {(r.recipe, r.provider, r.timing) for r in rows} == {
        (recipe, provider, timing)
        for recipe in fp8.RECIPES
        for provider in fp8.PROVIDERS
        for timing in ("graph", "eager")
    }
    for r in rows:
        if r.provider == "tritongemm":
            assert r.status == "ok" and r.ms > 0 and r.max_rel_err <= 8e-3
        else:  # torch took the recipe (then it was checked) or refused it (then its error is the status)
            assert r.status == "ok" or r.status.startswith("error: ")
    with open(tmp_path / "fp8-cpu.csv") as f:
        written = list(csv.DictReader(f))
    assert list(written[0]) == csv_fields(fp8.COLUMNS) and len(written) == sum(r.ms is not None for r in rows)


def test_a_wrong_provider_is_reported_and_not_timed():
    def zeros(a, b, sa, sb):  # on the operands' device, so it is judged wrong, not refused
        return a.new_zeros(a.shape[0], b.shape[1], dtype=torch.float32)

    wrong = {"tritongemm": zeros, "torch": fp8._torch_scaled_mm}
    problem = fp8.Fp8Problem("tensor", 16, 32, 128)
    device = "cuda" if ON_GPU else "cpu"
    rows = fp8.measure_fp8(problem, device=device, device_name="test", timings=("graph",), rounds=1, providers=wrong)
    ours = next(r for r in rows if r.provider == "tritongemm")
    assert ours.status == "wrong" and ours.ms is None


def test_named_kernels_are_timed_beside_auto_on_the_recipes_they_take(tmp_path):
    """Each kernel named is timed on the recipes it takes (fp8_ws: tensor and row scales, not block)."""
    kernels = ("fp8_grouped", "fp8_ws") if ON_GPU else ("fp8_grouped",)
    rows = fp8.run_fp8(
        shapes=[(16, 32, 128)], out_dir=tmp_path, rounds=1, timings=("graph",), kernels=(*kernels, "auto")
    )
    named = {(r.recipe, r.provider) for r in rows if r.provider not in fp8.PROVIDERS}
    takes = {k: registry.get(k, family="scaled_mm").recipes for k in kernels}
    assert named == {(recipe, k) for k in kernels for recipe in fp8.RECIPES if recipe in takes[k]}
    assert all(r.status == "ok" for r in rows if r.provider in kernels)
    assert (tmp_path / ("fp8.png" if ON_GPU else "fp8-cpu.png")).exists()


def test_the_invariant_mode_is_timed_beside_the_default_on_the_row_and_block_recipes(tmp_path):
    """--kernels auto:batch_invariant: scaled_mm(..., batch_invariant=True) on the recipes whose scales
    belong to their rows, checked against fp64 and summarized beside the default."""
    rows = fp8.run_fp8(shapes=[(16, 32, 128)], out_dir=tmp_path, rounds=1, timings=("graph",),
                       kernels=(registry.BATCH_INVARIANT,))  # fmt: skip
    invariant = [r for r in rows if r.provider == registry.BATCH_INVARIANT]
    assert sorted(r.recipe for r in invariant) == sorted(fp8.INVARIANT_RECIPES)
    assert all(r.status == "ok" and r.ms > 0 for r in invariant)
    assert any(registry.BATCH_INVARIANT in line and "all M" in line for line in fp8.summary(rows))


def test_a_kernel_this_device_cannot_run_is_named_not_timed():
    """On CPU tensors a Gluon kernel is refused, and a `tl` one runs where the interpreter is on
    (the CPU run); in the GPU run, where it is off, the `tl` kernel is refused too, saying why."""
    kept, refused = fp8.runnable_kernels(("fp8_grouped", "fp8_tma"), "cpu")
    gluon = "fp8_tma: not timed: Gluon kernel: needs a CUDA GPU (Gluon has no interpreter)"
    if device_info.interpreter_active():
        assert kept == ("fp8_grouped",) and refused == [gluon]
    else:
        assert kept == () and refused[1] == gluon
        assert refused[0].startswith("fp8_grouped: not timed: CPU tensors run under the Triton interpreter only")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "fp8", "--kernels", "grouped"], "bench fp8: --kernels grouped is not a scaled_mm kernel"),
        (["bench", "ladder", "--kernels", "fp8_tma"], "bench ladder: --kernels fp8_tma is not a matmul kernel"),
        (["bench", "fp8", "--kernels", "nope"], "argument --kernels: expected comma-separated names"),
        (["bench", "grouped", "--kernels", "fp8_tma"], "bench grouped: --kernels does not apply"),
    ],
)
def test_the_cli_refuses_kernels_of_another_family(capsys, argv, message):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
