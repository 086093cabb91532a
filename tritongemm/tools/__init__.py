"""See inside the kernels: one module per tool, each a `tritongemm` subcommand (cli/tools.py).

  schedule   which program (SM, step) computes each output tile, as a picture   (schedule.py)
  l2         how many bytes of A and B each tile ordering fetches from DRAM       (l2.py)
  explain    the numpy rewrite of one program's offsets and masks               (explain.py)
  predict    a calibrated performance model that says which term bounds a GEMM  (predict.py)

`launch.py` holds what they share (kernel -> tile ordering, programs per SM, waves; the H100's
numbers; which rungs the tools model and why they refuse the others) and `ncu.py` reads the
Nsight Compute logs of scripts/ci/ncu-l2.sh. Everything here runs on a CPU: no kernel is launched.
"""
