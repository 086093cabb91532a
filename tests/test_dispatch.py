"""What kernel="auto" chooses (dispatch.choose), on the CPU: every kernel is made available
with its GPU dtypes, as on an H100, so the choice alone is tested; meta tensors stand for operands
of any size. Whether the choices are fast is for the benchmarks to say (BENCHMARKS.md)."""

import pytest
import torch

from tritongemm import dispatch
from tritongemm.core import registry
from tritongemm.dispatch import table as dispatch_table

F16, F32 = torch.float16, torch.float32


@pytest.fixture(autouse=True)
def as_on_an_h100(monkeypatch):
    monkeypatch.setattr(registry.KernelInfo, "unavailable_reason", lambda self, device: None)
    monkeypatch.setattr(registry.KernelInfo, "dtypes_on", lambda self, device: self.dtypes)


def operand(rows, cols, dtype=F16, row_stride=None):
    """A (rows, cols) meta tensor whose rows are row_stride elements apart (default: cols)."""
    storage = torch.empty(rows * (row_stride or cols), device="meta", dtype=dtype)
    return storage.as_strided((rows, cols), (row_stride or cols, 1))


def choose(a, b, out_dtype=None) -> str:
    return dispatch.choose("auto", None, a, b, out_dtype or a.dtype)[0].name


def test_aligned_operands_take_the_top_rung():
    assert choose(operand(256, 512), operand(512, 384)) == "tma_persistent_pipelined"
    assert choose(operand(256, 512), operand(384, 512).T) == "tma_persistent_pipelined"  # a weight's view


def test_skinny_m_takes_swap_ab():
    assert choose(operand(16, 4096), operand(4096, 4096)) == "swap_ab"
    assert choose(operand(dispatch.SKINNY_M, 4096), operand(4096, 4096)) == "swap_ab"
    assert choose(operand(dispatch.SKINNY_M + 1, 4096), operand(4096, 4096)) == "tma_persistent_pipelined"


@pytest.mark.parametrize(
    "M, N, K, b_k_major, expected",
    [
        (4096, 4096, 512, False, "tma_ping_pong"),  # 512 tiles of 128 x 256 on 132 SMs
        (4096, 4096, 512, True, "tma_ping_pong"),  # B a weight's view
        (8192, 8192, 256, False, "tma_ping_pong"),
        (4096, 4096, 576, False, "tma_persistent_pipelined"),  # K past SHORT_K
        (2048, 2048, 512, False, "tma_persistent_pipelined"),  # 128 tiles: one wave
        (4096, 4000, 512, False, "tma_persistent_pipelined"),  # B's rows 8,000 bytes: not whole lines
        (4096, 4096, 488, False, "tma_persistent_pipelined"),  # A's rows 976 bytes
    ],
)
def test_short_k_on_a_large_c_takes_ping_pong(monkeypatch, M, N, K, b_k_major, expected):
    monkeypatch.setattr(dispatch, "_sm_count", lambda device: 132)
    b = operand(N, K).T if b_k_major else operand(K, N)
    assert choose(operand(M, K), b) == expected


def test_short_k_rule_needs_a_gpu():
    assert choose(operand(4096, 512), operand(512, 4096)) == "tma_persistent_pipelined"  # meta: no SM count


def test_what_tma_cannot_take():
    assert choose(operand(256, 512, F32), operand(512, 384, F32)) == "persistent"  # TMA rungs: fp16/bf16
    assert choose(operand(256, 512), operand(512, 384), out_dtype=F32) == "persistent"  # C in the inputs' dtype


@pytest.mark.parametrize(
    "M, N, K, expected",
    [
        (256, 64, 100, "grouped"),  # 2 * 256 * 64 * 100 FLOPs: the copy would cost more than it saves
        (997, 1009, 1013, "grouped"),  # 2**31 FLOPs: the copies' host time would cost more too
        (12345, 4567, 2345, "tma_persistent_pipelined"),  # issue 14's case: 0.15x untouched, 3.3x copied
        (2048, 1024, 1024, "tma_persistent_pipelined"),  # 2**32 FLOPs, STAGING_MIN_FLOPS
    ],
)
def test_misaligned_rows_are_copied_for_large_problems_only(M, N, K, expected):
    """Rows of K fp16 elements with K not a multiple of 8: not 16-byte aligned, so TMA needs a copy."""
    assert choose(operand(M, K), operand(K, N, row_stride=N + 1)) == expected


def test_no_copy_serves_a_dimension_past_what_a_descriptor_takes():
    a, b = operand(2**31, 24, row_stride=25), operand(24, 64)
    assert choose(a, b) == "persistent"


# ---------------------------------------------------------------------------------------------
# The measured table (dispatch/table.py): buckets, the file, which table applies, and its use
# ---------------------------------------------------------------------------------------------

H100 = "NVIDIA H100 80GB HBM3"


def test_buckets_round_up_to_powers_of_two_and_know_the_layout():
    bucket = dispatch_table.bucket_of(operand(1000, 4096), operand(14336, 4096).T)
    assert bucket == dispatch_table.Bucket("float16", "nt", True, 1024, 16384, 4096)
    assert dispatch_table.bucket_of(operand(1, 100).T.T, operand(100, 8, row_stride=9)).m == 1
    assert not dispatch_table.bucket_of(operand(64, 100), operand(100, 64)).aligned  # 200-byte rows


def winner_table(path=None, device=H100, **entry) -> dispatch_table.Table:
    bucket = dispatch_table.Bucket("float16", "nn", True, 512, 512, 512)
    row = dict(kernel="grouped", config="64x64x64 g8 w4 s4", problem=[300, 400, 500], ms=0.010, cublas_ms=0.012)
    return dispatch_table.Table(device, "2.11.0", "3.6.0", {bucket: row | entry}, path)


def test_a_table_survives_its_file(tmp_path):
    table = winner_table()
    table.save(tmp_path / "t.json")
    again = dispatch_table.Table.from_json((tmp_path / "t.json").read_text(), tmp_path / "t.json")
    assert again.entries == table.entries and (again.device, again.torch, again.triton) == (H100, "2.11.0", "3.6.0")
    text = (tmp_path / "t.json").read_text().replace('"format": 1', '"format": 99')
    assert dispatch_table.Table.from_json(text) is None  # another layout of file: ignored, never misread


def test_the_users_table_comes_before_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONGEMM_CACHE_DIR", str(tmp_path / "user"))
    monkeypatch.setattr(dispatch_table, "SHIPPED", tmp_path / "shipped")
    dispatch_table.reload()
    assert dispatch_table.table_for(H100) is None
    winner_table(kernel="naive").save(dispatch_table.shipped_table_path(H100))
    dispatch_table.reload()
    assert dispatch_table.table_for(H100).entries  # the shipped one, for want of another
    assert next(iter(dispatch_table.table_for(H100).entries.values()))["kernel"] == "naive"
    winner_table(kernel="persistent").save(dispatch_table.user_table_path(H100))
    dispatch_table.reload()
    assert next(iter(dispatch_table.table_for(H100).entries.values()))["kernel"] == "persistent"
    assert dispatch_table.table_for("NVIDIA A100-SXM4-80GB") is None  # another GPU: no table
    dispatch_table.reload()


def test_auto_takes_the_tables_winner_where_it_can(monkeypatch):
    table = winner_table()
    monkeypatch.setattr(dispatch_table, "lookup", lambda a, b: table.choose(dispatch_table.bucket_of(a, b)))
    a, b = operand(300, 512), operand(512, 400)  # the table's bucket: rows of 1024 and 800 bytes
    info, config, why = dispatch.choose("auto", None, a, b, F16)
    assert (info.name, config.short()) == ("grouped", "64x64x64 g8 w4 s4") and "1.20x cuBLAS" in why
    assert "rules' choice" not in why  # a table from before the tuner timed it
    table = winner_table(rules_ms=0.0125)
    assert "(the rules' choice: 12.5 us)" in dispatch.choose("auto", None, a, b, F16)[2]
    table = winner_table()
    assert dispatch.choose("auto", None, operand(1000, 512), b, F16)[0].name == "tma_persistent_pipelined"  # no bucket
    table = winner_table(kernel="tma_persistent_pipelined", config=None)  # a winner that can't write fp32
    assert dispatch.choose("auto", None, a, b, F32)[0].name == "persistent"


def test_explain_says_what_and_why():
    text = dispatch.explain(operand(200, 100), operand(100, 64))
    assert text.startswith("200 x 64 x 100 float16 on meta: grouped, ")
    assert "rows TMA can't read, under 4.3e+09 FLOPs" in text
    text = dispatch.explain(operand(256, 512, F32), operand(512, 384, F32))  # no TMA rung for fp32
    assert "persistent" in text and "not tma_persistent_pipelined: no float32 here" in text


def test_fp32_buckets_follow_the_tf32_switch():
    a, b = operand(256, 512, F32), operand(512, 384, F32)
    torch.backends.cuda.matmul.allow_tf32 = False
    ieee = dispatch_table.bucket_of(a, b)
    torch.backends.cuda.matmul.allow_tf32 = True  # the conftest fixture restores it
    assert (ieee.dtype, dispatch_table.bucket_of(a, b).dtype) == ("float32", "float32+tf32")


@pytest.mark.parametrize("path", sorted(dispatch_table.SHIPPED.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_table_reads_and_names_what_exists(path):
    table = dispatch_table.Table.from_json(path.read_text(), path)
    assert table is not None and path.name == f"{dispatch_table._slug(table.device)}.json" and table.entries
    for bucket in table.entries:
        choice = table.choose(bucket)
        info = registry.get(choice.kernel)
        assert not info.experimental and bucket.dtype.removesuffix("+tf32") in {str(d)[6:] for d in info.dtypes}
        assert choice.config is None or choice.config.short() == table.entries[bucket]["config"]
