"""The README's first example runs on a CPU, in seconds, and says the result matches torch."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU example; the GPU runs the GPU tests")
def test_readme_cpu_example():
    text = (ROOT / "README.md").read_text()
    example = re.search(r"```python\n(import os, time\n.*?)```", text, re.S).group(1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", example], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(r"matches torch: True, \d+\.\d s\n", done.stdout), done.stdout
