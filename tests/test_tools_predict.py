"""tools/predict.py: the model's terms on hand-checkable shapes, the uncalibrated defaults against
the H100 numbers we have, and calibration recovering known constants from a synthetic CSV."""

import csv
import json
import math

import pytest

from tritongemm.bench.report import COLUMNS
from tritongemm.cli import main
from tritongemm.core.config import MatmulConfig
from tritongemm.tools import predict
from tritongemm.tools.predict import DEFAULTS, Constants, KernelConstants

# Measured on the H100 (bf16 cuBLAS, TFLOP/s): the defaults must land within 10% before calibration.
CUBLAS_H100 = [((4096, 4096, 4096), 735), ((8192, 8192, 8192), 680), ((8192, 8192, 512), 595)]


@pytest.mark.parametrize("shape, measured", CUBLAS_H100)
def test_defaults_near_measured_cublas(shape, measured):
    p = predict.predict("cublas", *shape, "bfloat16", constants=DEFAULTS)
    assert p.tflops == pytest.approx(measured, rel=0.10)
    assert p.bound == "compute"


def test_terms_count_padding_and_waves():
    config = MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)
    t = predict.terms("grouped", 1000, 300, 100, "float16", config)  # 8 x 3 tiles, K padded to 128
    assert (t.tiles, t.rounds) == (24, 1)
    assert t.tile_efficiency == pytest.approx(1000 * 300 * 100 / (24 * 128 * 128 * 128))
    assert t.wave_efficiency == pytest.approx(24 / 132)
    assert t.ideal_compute_s == pytest.approx(2 * 128 * 128 * 128 / (989.4e12 / 132))


def test_wave_quantization_shows_in_rounds():
    config = MatmulConfig(BLOCK_M=128, BLOCK_N=256)
    t133 = predict.terms("tma_persistent", 128 * 133, 256, 4096, "bfloat16", config)  # one tile too many
    t132 = predict.terms("tma_persistent", 128 * 132, 256, 4096, "bfloat16", config)
    assert (t132.rounds, t133.rounds) == (1, 2)
    assert t133.wave_efficiency == pytest.approx(133 / 264)


def test_skinny_gemm_is_memory_bound():
    p = predict.predict("cublas", 1, 14336, 4096, "bfloat16", constants=DEFAULTS)  # a decode step's MLP
    assert p.bound == "memory"
    assert p.terms.memory_s == pytest.approx((14336 * 4096 + 4096 + 14336) * 2 / 3.0e12, rel=0.01)


def test_tiny_gemm_is_launch_bound():
    assert predict.predict("naive", 64, 64, 64, "float16", constants=DEFAULTS).bound == "launch"


@pytest.mark.parametrize(
    "config",
    [MatmulConfig(128, 256, 64, 8, 8, 3), MatmulConfig(64, 128, 32, 1, 4, 4, scheduler="chunked")],
    ids=lambda c: c.short(),
)
def test_config_labels_round_trip(config):
    assert predict.parse_config_label(config.short()) == config
    assert predict.parse_config_label(f"default {config.short()}") == config  # a default, as bench names it
    assert predict.parse_config_label("default") is None


def test_the_warp_specialized_rungs_are_modelled_with_their_own_tiles():
    """Rung 9 defaults to 128 x 256 where it fills the SMs, rung 11 to 128 x 128 (a C tile per consumer)."""
    ws = predict.predict("tma_warp_specialized", 8192, 8192, 8192, constants=DEFAULTS)
    ping_pong = predict.predict("tma_ping_pong", 8192, 8192, 8192, constants=DEFAULTS)
    assert (ws.terms.config.BLOCK_N, ping_pong.terms.config.BLOCK_N) == (256, 128)
    assert ws.terms.rounds == 16 and ping_pong.terms.rounds == 32


# A synthetic benchmark: the model with known constants, times 1 +- `noise` (deterministic).
TRUE = Constants(
    launch_us=4.0,
    kernels={
        "cublas": KernelConstants(0.75, 1.0),
        "grouped/bfloat16": KernelConstants(0.58, 4.0),
        "grouped/float16": KernelConstants(0.55, 4.0),
        "tma_persistent_pipelined": KernelConstants(0.70, 0.5),
    },
)
SHAPES = [(4096, 4096, 4096), (8192, 8192, 512), (8192, 8192, 2048), (3000, 5000, 1000), (2000, 1000, 2000),
          (128, 4096, 4096), (208, 416, 304), (16, 14336, 4096)]  # fmt: skip


def _write_synthetic_csv(path, noise=0.04):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        i = 0
        for kernel in ("cublas", "grouped", "tma_persistent_pipelined"):
            for dtype in ("bfloat16", "float16"):
                for M, N, K in SHAPES:
                    i += 1
                    ms = predict.predict(kernel, M, N, K, dtype, constants=TRUE).time_s * 1e3
                    ms *= 1 + noise * math.sin(7.0 * i)
                    label = "torch.matmul" if kernel == "cublas" else "default"
                    writer.writerow(dict(device="NVIDIA H100 80GB HBM3", dtype=dtype, layout="nn", m=M, n=N, k=K,
                                         kernel=kernel, config=label, ms=ms, tflops=2 * M * N * K / ms / 1e9,
                                         ratio_to_cublas="", max_rel_err=1e-3, status="ok"))  # fmt: skip
        writer.writerow(dict(device="x", dtype="bfloat16", layout="nn", m=1, n=1, k=1, kernel="naive",
                             config="default", ms="", tflops="", ratio_to_cublas="", max_rel_err=1.0,
                             status="wrong"))  # fmt: skip


def test_calibration_recovers_exact_constants(tmp_path):
    path = tmp_path / "synthetic.csv"
    _write_synthetic_csv(path, noise=0.0)
    rows = predict.read_measurements([path])
    assert len(rows) == 3 * 2 * len(SHAPES)  # the "wrong" row is skipped
    fitted = predict.calibrate(rows)
    assert fitted.launch_us == TRUE.launch_us
    for key in ("cublas", "grouped/bfloat16", "grouped/float16", "tma_persistent_pipelined"):
        assert fitted.kernels[key].efficiency == pytest.approx(TRUE.kernels[key].efficiency, abs=0.005)
        assert fitted.kernels[key].tile_overhead_us == pytest.approx(TRUE.kernels[key].tile_overhead_us, abs=0.25)


def test_calibration_fits_noisy_measurements(tmp_path):
    path = tmp_path / "synthetic.csv"
    _write_synthetic_csv(path, noise=0.04)
    rows = predict.read_measurements([path])
    fitted = predict.calibrate(rows)
    assert predict.median_abs_error(predict.compare(rows, fitted)) <= 0.04
    for key in ("cublas", "grouped/bfloat16", "grouped/float16"):
        assert fitted.kernels[key].efficiency == pytest.approx(TRUE.kernels[key].efficiency, abs=0.05)


def test_calibrate_command_writes_constants_and_reports(tmp_path, capsys):
    path, out = tmp_path / "synthetic.csv", tmp_path / "constants.json"
    _write_synthetic_csv(path)
    assert main(["predict", "--calibrate", str(path), "--write", str(out)]) == 0
    text = capsys.readouterr().out
    assert "meets the 10% target" in text
    constants = Constants.from_json(out.read_text())
    assert json.loads(out.read_text())["source"].startswith("calibrated")

    assert main(["predict", "4096", "4096", "4096", "--constants", str(out), "--kernel", "cublas"]) == 0
    text = capsys.readouterr().out
    assert "calibrated" in text and "cublas" in text
    assert constants.of("tma_pipelined", "bfloat16") == DEFAULTS.kernels["tma_pipelined"]  # not in the CSV


def test_compare_command_prints_markdown(tmp_path, capsys):
    path = tmp_path / "synthetic.csv"
    _write_synthetic_csv(path)
    assert main(["predict", "--compare", str(path), "--markdown", "--constants", "defaults"]) == 0
    text = capsys.readouterr().out
    assert (
        "| kernel | dtype | layout | shape | tile | measured TFLOP/s | predicted TFLOP/s | time error | bound |" in text
    )
    assert "| cublas | bfloat16 | nn | 4096x4096x4096 | 128x256x64 |" in text


def test_predict_command_lists_every_kernel_and_cublas(capsys):
    assert main(["predict", "8192", "8192", "512", "--dtype", "float16", "--constants", "defaults"]) == 0
    text = capsys.readouterr().out
    for kernel in predict.PROVIDERS:
        assert f"\n{kernel} " in text
    assert "built-in defaults" in text


def test_odd_width_is_modelled_as_rung_6_on_its_tiles():
    """512 x 2560: rung 13's 64 x 192 tiles make one wave where rung 6's 64 x 128 make two."""
    odd = predict.predict("odd_width", 512, 2560, 8192, constants=DEFAULTS)
    rung6 = predict.terms("tma_persistent_pipelined", 512, 2560, 8192, "bfloat16", MatmulConfig(64, 128, 64))
    assert (odd.terms.config.BLOCK_N, odd.terms.tiles, odd.terms.rounds) == (192, 112, 1)
    assert (rung6.tiles, rung6.rounds) == (160, 2)
    assert odd.constants == DEFAULTS.kernels["odd_width"]


@pytest.mark.parametrize("kernel", ["split_k", "stream_k", "split_tail", "swap_ab"])
def test_a_rung_that_splits_k_is_refused_by_name(kernel, capsys):
    with pytest.raises(ValueError, match=f"predict: kernel '{kernel}' splits K across programs.*does not cover"):
        predict.terms(kernel, 1, 4096, 14336, "bfloat16")
    assert main(["predict", "1", "4096", "14336", "--kernel", kernel]) == 2
    assert f"kernel '{kernel}' splits K across programs" in capsys.readouterr().err
