"""Which provider's prefill fails at bench decode's largest batch (256 sequences x 512 tokens =
131072 rows): each provider in a subprocess of its own (an illegal address ends the CUDA context),
with CUDA_LAUNCH_BLOCKING=1 so the traceback names the launch.
  PYTHONPATH=. python3 scripts/probes/decode/large_prefill.py [family] [batch] [layers]"""

import os
import subprocess
import sys

import torch


def one(family: str, provider: str, batch: int, layers: int) -> None:
    from tritongemm.bench import decode
    from tritongemm.bench.model import VOCAB_SIZE, build_base, family_config

    config = family_config(family, layers, VOCAB_SIZE)
    base = build_base(family, config, device="cuda", dtype=torch.bfloat16)
    model = decode.provider_model(base, provider)
    prompt = torch.randint(0, VOCAB_SIZE, (batch, decode.PROMPT), device="cuda")
    with torch.inference_mode():
        loop = decode.DecodeLoop(model, prompt, 4, capture=True)
        loop.step()
    torch.cuda.synchronize()
    print(f"{family} {provider} batch {batch}: ok")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        one(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        sys.exit(0)
    family = sys.argv[1] if len(sys.argv) > 1 else "qwen2-7b"
    batch = sys.argv[2] if len(sys.argv) > 2 else "256"
    layers = sys.argv[3] if len(sys.argv) > 3 else "1"
    from tritongemm.bench.decode import PROVIDERS

    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    for provider in PROVIDERS:
        r = subprocess.run([sys.executable, __file__, "--one", family, provider, batch, layers], env=env,
                           capture_output=True, text=True, timeout=240)  # fmt: skip
        print(f"== {provider}: rc {r.returncode}")
        print(r.stdout[-1500:])
        if r.returncode:
            print(r.stderr[-4000:])
