"""Where a kernel's warps wait, from Nsight Compute's exports of one profiled launch: the share of
each stall reason (`--page raw`), and the SASS instructions that gathered the most stall samples
with their two main reasons (`--page source --print-source sass`). scripts/probes/fp8/ncu-fp8-block.sh
--stalls writes the exports; this reads them.

    python3 scripts/probes/fp8/ncu_stalls.py RAW.csv SASS.csv [TOP]
"""

import csv
import sys


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def reasons(raw_csv: str) -> list[tuple[str, float]]:
    """(reason, share of all samples), largest first."""
    names, _units, values = list(csv.reader(open(raw_csv)))[:3]
    prefix = "smsp__pcsamp_warps_issue_stalled_"
    stalls = {n[len(prefix) :]: number(v) for n, v in zip(names, values) if n.startswith(prefix)}
    stalls = {n: v for n, v in stalls.items() if not n.endswith("not_issued")}
    total = sum(stalls.values()) or 1.0
    return sorted(((n, v / total) for n, v in stalls.items()), key=lambda item: -item[1])


def hot_instructions(sass_csv: str, top: int) -> list[str]:
    rows = list(csv.reader(open(sass_csv)))
    header = next(r for r in rows if "Source" in r)
    body = rows[rows.index(header) + 1 :]
    samples, source = header.index("Warp Stall Sampling (All Samples)"), header.index("Source")
    executed = header.index("Instructions Executed")
    kinds = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(number(r[samples]) for r in body) or 1.0
    hot = sorted(range(len(body)), key=lambda i: -number(body[i][samples]))[:top]
    lines = []
    for i in sorted(hot):  # in program order
        row = body[i]
        why = sorted(((number(row[k]), header[k][len("stall_") :]) for k in kinds), reverse=True)[:2]
        why = " ".join(f"{name} {count:.0f}" for count, name in why if count)
        lines.append(
            f"{i:5d} {number(row[samples]) / total:6.1%} x{row[executed]:>7s}  {row[source].strip()[:64]:64s} {why}"
        )
    return lines


if __name__ == "__main__":
    raw, sass = sys.argv[1], sys.argv[2]
    print("stall reasons (share of all samples):")
    for name, share in reasons(raw)[:12]:
        print(f"  {name:28s} {share:6.1%}")
    print("hottest instructions (line, share of samples, times executed, SASS, main reasons):")
    print("\n".join(hot_instructions(sass, int(sys.argv[3]) if len(sys.argv) > 3 else 30)))
