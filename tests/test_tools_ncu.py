"""tools/ncu.py: reading Nsight Compute CSV logs (both layouts ncu writes) and the
predicted-vs-measured L2 table."""

import pytest

from tritongemm.cli import main
from tritongemm.tools import ncu

HEADER = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'  # noqa: E501


def _long(kernel, hit, read_hit, dram):
    prefix = f'"0","7","python3","h","{kernel}","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics"'  # noqa: E501
    return "\n".join(
        [
            "==PROF== Connected to process 7 (/usr/bin/python3.12)",
            '==PROF== Profiling "_grouped_kernel" - 0: 0%....50%....100% - 1 pass',
            HEADER,
            f'{prefix},"dram__bytes_read.sum","byte","{dram:,}"',
            f'{prefix},"lts__t_sector_hit_rate.pct","%","{hit}"',
            f'{prefix},"lts__t_sector_op_read_hit_rate.pct","%","{read_hit}"',
        ]
    )


# --page raw: one column per metric, a units row under the header, unscaled units.
WIDE = "\n".join(
    [
        "==PROF== Disconnected from process 7",
        HEADER.replace(',"Section Name","Metric Name","Metric Unit","Metric Value"', "")
        + ',"dram__bytes_read.sum","lts__t_sector_hit_rate.pct"',
        '"","","","","","","","","","","","Mbyte","%"',
        '"0","7","python3","h","_naive_kernel","1","7","(256, 1, 1)","(64, 32, 1)","0","9.0","2,345.5","81.02"',
    ]
)


def test_reads_one_row_per_metric_layout():
    (launch,) = ncu.read_ncu_csv(_long("_grouped_kernel", 87.5, 88.25, 1493000000))
    assert launch == {
        "kernel": "_grouped_kernel",
        ncu.DRAM_READ: 1493000000.0,
        ncu.HIT_RATE: 87.5,
        ncu.READ_HIT_RATE: 88.25,
    }


def test_reads_one_column_per_metric_layout_with_units():
    (launch,) = ncu.read_ncu_csv(WIDE)
    assert launch["kernel"] == "_naive_kernel"
    assert launch[ncu.DRAM_READ] == pytest.approx(2345.5e6)
    assert launch[ncu.HIT_RATE] == pytest.approx(81.02)


def test_log_without_results_gives_nothing():
    assert ncu.read_ncu_csv("==PROF== Connected\n==ERROR== Failed to profile") == []


def test_table_from_a_log_directory(tmp_path, capsys):
    (tmp_path / "ncu-grouped-8192x8192x8192-bfloat16.csv").write_text(_long("_grouped_kernel", 87.5, 88.2, 1.49e9))
    (tmp_path / "ncu-tma_persistent-chunked-8192x8192x512-bfloat16.csv").write_text(
        _long("_tma_persistent_kernel", 84.0, 97.9, 17_000_000)
    )
    (tmp_path / "ncu-naive-8192x8192x8192-bfloat16.csv").write_text("==ERROR== no kernels profiled")
    rows = ncu.compare(tmp_path)
    assert [(r.label, r.estimate.K) for r in rows] == [("tma_persistent (chunked)", 512), ("grouped", 8192)]
    assert rows[0].estimate.launch.ordering == "chunked"

    assert main(["l2", "--ncu", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    grouped = next(line for line in table.splitlines() if line.startswith("| grouped |"))
    cells = [c.strip() for c in grouped.strip("|").split("|")]
    assert cells[:3] == ["grouped", "8192x8192x8192", "128x256 g8"]
    assert (cells[3], cells[4], cells[6], cells[8]) == (
        f"{100 * rows[1].estimate.hit_rate:.1f}%",
        "87.5%",
        "88.2%",
        "1.490",
    )
    assert "| tma_persistent (chunked) | 8192x8192x512 |" in table
