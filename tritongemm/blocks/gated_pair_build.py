"""How a gated pair's plan is built, on its first call (blocks/gated_pair.py checked it): the
kernel chosen (dispatch/gated_pair.py), rung 6's or 9's gated epilogue compiled on its tile, or
grouped_mm's row-group kernel over one group."""

from __future__ import annotations

import torch

from tritongemm.core import registry
from tritongemm.core.tma import empty_output
from tritongemm.dispatch import gated_pair as choice
from tritongemm.dispatch.tiles import gated_config
from tritongemm.grouped.build import dense_pair_plan
from tritongemm.primitives.tl.host import sm_count


def pair_call(rows: torch.Tensor, weight: torch.Tensor, activation: str, kernel: str):
    """(call, writes_into) for checked operands like these (gated_pair.py `planned_pair`)."""
    if kernel == "auto":
        kernel = choice.choose(rows, weight)
    if kernel != "auto":
        return _rung_plan(kernel, rows, weight, activation)
    return dense_pair_plan(rows, weight, activation), True


def _rung_plan(kernel: str, rows: torch.Tensor, weight: torch.Tensor, activation: str):
    info = registry.get(kernel, "gated_pair")
    (M, K), N = rows.shape, weight.shape[0] // 2
    if M == 0 or N == 0 or K == 0:  # nothing to launch: act(0) * 0 is 0
        return (lambda rows, weight: rows.new_zeros((M, N))), False
    # The rung's plan refuses what it can't read in place (pipeline.check_gated_pair, the descriptors).
    config = gated_config(kernel, M, N, K, sm_count(rows.device))
    c = empty_output(M, N, rows.dtype, rows.device)  # this call's, to plan on
    launch = info.plan(rows, weight.T, c, config, glu=activation)

    def call(rows, weight, out=None):
        c = empty_output(M, N, rows.dtype, rows.device) if out is None else out
        launch(rows, weight.T, c)
        return c

    return call, c.is_contiguous()  # a padded c's layout is not a contiguous out's
