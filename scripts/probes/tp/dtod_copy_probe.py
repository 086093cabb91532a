"""Does a copy within one GPU take the SMs? A 64 MB device-to-device copy and a cuBLAS GEMM on two
streams, released together by an event after a spin, in either order, beside each alone.

    python3 scripts/probes/tp/dtod_copy_probe.py

Prints each case's GPU activity from torch's profiler (us after the spin's end, +duration). A
copy engine's copy would run beside the GEMM; a copy the driver runs on the SMs waits for the
GEMM's thread blocks to leave, or holds the GEMM back until it ends
(results/h100/probes/tp/dtod-copy-takes-sms.txt; exchange.py's push is why it matters).
"""

import json
import tempfile

import torch


def main() -> None:
    device = torch.device("cuda")
    x = torch.randn(4096, 8192, device=device).to(torch.bfloat16)  # 64 MB
    buf = torch.empty_like(x)
    a = torch.randn(4096, 8192, device=device).to(torch.bfloat16)
    b = torch.randn(8192, 5120, device=device).to(torch.bfloat16)
    spin, first, second = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    go = torch.cuda.Event()

    def copy():
        buf.copy_(x)

    def gemm():
        torch.mm(a, b)

    def run(one, other):
        with torch.cuda.stream(spin):
            torch.cuda._sleep(1_000_000)  # both queued behind it before either starts
            go.record(spin)
        for stream, work in ((first, one), (second, other)):
            if work is not None:
                stream.wait_event(go)
                with torch.cuda.stream(stream):
                    work()
        torch.cuda.synchronize()

    cases = {"copy alone": (copy, None), "gemm alone": (gemm, None), "gemm then copy": (gemm, copy),
             "copy then gemm": (copy, gemm)}  # fmt: skip
    print(torch.cuda.get_device_name(device), "torch", torch.__version__)
    for name, (one, other) in cases.items():
        for _ in range(2):
            run(one, other)
        with torch.profiler.profile() as prof:
            run(one, other)
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            trace = json.load(open(f.name))
        gpu = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")]
        mark = [e for e in gpu if "spin" in e["name"]][-1]
        t0 = mark["ts"] + mark["dur"]
        seen = [f"{e['name'][:28]} @{e['ts'] - t0:.0f} +{e['dur']:.0f}" for e in gpu if e is not mark and e["ts"] >= t0]
        print(f"{name:16s}", "  ".join(seen))


if __name__ == "__main__":
    main()
