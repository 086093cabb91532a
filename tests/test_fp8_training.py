"""Fp8TrainingLinear: the forward and both gradients, each against the fp64 product of the very fp8
operands its GEMM was given (what the kernel must compute) and, loosely, against the unquantized
fp64 gradient (what training needs); the parameters shared and trained; bad arguments refused.
CPU under the interpreter, and the GPU."""

from __future__ import annotations

import pytest
import torch
from cases import DEVICE

from tritongemm.core.reference import fp8_tolerance, rel_error
from tritongemm.fp8.recipes import reference_quantize, reference_scaled_mm
from tritongemm.fp8.training import Fp8TrainingLinear

# (recipe, wgrad, M, K, N): odd token counts, widths that are and are not multiples of 16;
# block-wise needs K and N multiples of 128 (the forward reduces over K, dX over N).
CASES = [
    ("tensor", "fp8", 5, 48, 40),
    ("row", "fp8", 7, 40, 24),
    ("row", "bf16", 3, 32, 17),
    ("block", "bf16", 5, 128, 256),
]
# An fp8 gradient against the unquantized one: e4m3's 3 mantissa bits on each operand, a few
# percent on random data; far below what a wrong scale or axis gives (order 1).
FP8_VS_EXACT = 0.08


def _data(shape, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)


def _reference(a, b_rows, recipe, out_dtype):
    """The fp64 product of a and b_rows.T from their fp8 copies, made by torch
    (`reference_quantize`, the recipe's arithmetic): a along its rows (1 x 128 blocks for the
    block recipe), b_rows as a weight (128 x 128 blocks)."""
    a_fp8, scale_a = reference_quantize(a, recipe)
    b_fp8, scale_b = reference_quantize(b_rows, recipe, (128, 128) if recipe == "block" else None)
    scale_b = scale_b.T if recipe == "row" else scale_b
    return reference_scaled_mm(a_fp8, b_fp8.T, scale_a, scale_b, out_dtype=torch.float64).to(out_dtype)


def _train(model, optimizer, x, target, steps):
    """The losses of `steps` steps of a least-squares fit of model(x) to target."""
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("recipe,wgrad,M,K,N", CASES)
def test_forward_and_both_gradients_match_fp64_of_their_fp8_operands(recipe, wgrad, M, K, N):
    torch.manual_seed(0)
    layer = Fp8TrainingLinear(K, N, bias=True, device=DEVICE, recipe=recipe, wgrad=wgrad)
    x = _data((M, K), 1).requires_grad_()
    dy = _data((M, N), 2, scale=1e-3)  # a gradient's magnitude: the scales must follow it
    y = layer(x)
    y.backward(dy)
    x64, w64, dy64 = x.detach().double(), layer.weight.detach().double(), dy.double()

    ref_y = _reference(x.detach(), layer.weight.detach(), recipe, torch.float64) + layer.bias.double()
    assert rel_error(y.detach(), ref_y) <= fp8_tolerance(torch.float32, K)
    assert rel_error(x.grad, _reference(dy, layer.weight.detach().T, recipe, torch.float64)) <= fp8_tolerance(
        torch.float32, N
    )
    if wgrad == "fp8":
        ref_dw = _reference(dy.T, x.detach().T, recipe, torch.float64)
        assert rel_error(layer.weight.grad, ref_dw) <= fp8_tolerance(torch.float32, M)
    else:
        assert rel_error(layer.weight.grad, dy64.T @ x64) <= 1e-5
    assert rel_error(layer.bias.grad, dy64.sum(0)) <= 1e-6

    # and near the exact gradients: the right axes and scales, not just a consistent product
    assert rel_error(y.detach(), x64 @ w64.T + layer.bias.double()) <= FP8_VS_EXACT
    assert rel_error(x.grad, dy64 @ w64) <= FP8_VS_EXACT
    assert rel_error(layer.weight.grad, dy64.T @ x64) <= FP8_VS_EXACT


def _forward_saving(layer, x):
    """(layer(x), the (shape, dtype) of every tensor autograd saved for the backward)."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        return layer(x), saved


@pytest.mark.parametrize("recipe,wgrad,M,K,N", CASES)
def test_saving_the_weights_transpose_changes_no_bit_and_is_what_the_backward_keeps(recipe, wgrad, M, K, N):
    """Wᵀ's fp8 copy made in the forward's pass over W (save_weight_t) equals the backward's own
    quantization of W bit for bit, so both give the same step; it is kept until the backward as an
    (in, out) fp8 tensor, and without it nothing of W's but the parameter."""
    torch.manual_seed(3)
    results, kept = [], []
    for save in (True, False):
        layer = Fp8TrainingLinear(K, N, device=DEVICE, recipe=recipe, wgrad=wgrad, save_weight_t=save)
        with torch.no_grad():
            layer.weight.copy_(_data((N, K), 4))
            layer.bias.copy_(_data((N,), 5))
        x = _data((M, K), 6).requires_grad_()
        y, saved = _forward_saving(layer, x)
        y.backward(_data((M, N), 7, scale=1e-3))
        results.append((y.detach(), x.grad, layer.weight.grad, layer.bias.grad))
        kept.append(((K, N), torch.float8_e4m3fn) in saved)
    for with_t, without_t in zip(*results):
        assert torch.equal(with_t, without_t)
    assert kept == [True, False]


def test_an_outlier_token_spoils_only_its_own_row():
    """Row-wise, each token of X has its own scale: one token 10^4 times larger leaves the other
    tokens' outputs as accurate as before (tensor-wise, their values would sink to e4m3's
    subnormals)."""
    layer = Fp8TrainingLinear(32, 16, bias=False, device=DEVICE, recipe="row")
    x = _data((9, 32), 3)
    x[4] *= 1e4
    y = layer(x.requires_grad_())
    exact = x.detach().double() @ layer.weight.detach().double().T
    others = [r for r in range(9) if r != 4]
    assert rel_error(y.detach()[others], exact[others]) <= FP8_VS_EXACT


def test_from_linear_shares_the_parameters_and_an_optimizer_trains_them():
    torch.manual_seed(5)
    base = torch.nn.Linear(32, 24, device=DEVICE)
    layer = Fp8TrainingLinear.from_linear(base, "row")
    assert layer.weight is base.weight and layer.bias is base.bias
    assert layer.state_dict().keys() == base.state_dict().keys()
    optimizer = torch.optim.SGD(base.parameters(), lr=0.1)  # built on the model before the patch
    losses = _train(layer, optimizer, _data((16, 32), 6), _data((16, 24), 7), steps=5)
    assert losses[-1] < 0.9 * losses[0], losses


def test_leading_dimensions_are_kept():
    layer = Fp8TrainingLinear(16, 8, device=DEVICE, recipe="tensor")
    x = _data((2, 3, 16), 8).requires_grad_()
    y = layer(x)
    assert y.shape == (2, 3, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(recipe="int8"), "expected recipe to be one of"),
        (dict(recipe="row", wgrad="fp16"), "expected wgrad to be one of"),
        (dict(recipe="block", wgrad="fp8"), "recipe 'block' takes wgrad='bf16' only"),
        (dict(recipe="block"), "block scales need multiples of 128"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Fp8TrainingLinear(96, 64, device=DEVICE, **kwargs)
    with pytest.raises(TypeError, match="expected save_weight_t to be a bool, but got str"):
        Fp8TrainingLinear(96, 64, device=DEVICE, save_weight_t="yes")


def test_a_wrong_width_or_dtype_is_refused():
    layer = Fp8TrainingLinear(16, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"expected x of shape \(\.\.\., 16\)"):
        layer(torch.zeros(2, 12, device=DEVICE))
    with pytest.raises(TypeError, match="expected x of dtype"):
        layer(torch.zeros(2, 16, device=DEVICE, dtype=torch.float64))


def test_patch_trains_a_model_in_fp8_on_its_own_parameters():
    import tritongemm

    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(DEVICE)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2)  # built before the patch, as a training script may
    tritongemm.patch(model, fp8_training="row")
    assert [type(m) for m in model] == [Fp8TrainingLinear, torch.nn.ReLU, Fp8TrainingLinear]
    assert list(model.parameters()) == params and model.tritongemm_patch_report.replaced == ["0", "2"]
    losses = _train(model, optimizer, _data((24, 32), 10), _data((24, 8), 11), steps=8)
    assert losses[-1] < 0.8 * losses[0], losses


def test_patch_takes_a_config_for_the_weight_gradient_and_fsdp():
    import tritongemm
    from tritongemm.nn import Fp8TrainingConfig

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)).to(DEVICE)
    tritongemm.patch(model, fp8_training=Fp8TrainingConfig("row", wgrad="bf16", save_weight_t=False))
    assert all(isinstance(m, Fp8TrainingLinear) for m in model)
    assert [(m.recipe, m.wgrad, m.save_weight_t) for m in model] == [("row", "bf16", False)] * 2
    assert "save_weight_t=False" in repr(model[0])
    model(_data((4, 32), 12).requires_grad_()).sum().backward()
    assert all(m.weight.grad is not None for m in model)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(recipe="int8"), ValueError, "Fp8TrainingConfig: expected recipe to be one of"),
        (dict(wgrad="fp16"), ValueError, "Fp8TrainingConfig: expected wgrad to be one of"),
        (dict(recipe="block", wgrad="fp8"), ValueError, "recipe 'block' takes wgrad='bf16' only"),
        (dict(save_weight_t=1), TypeError, "expected save_weight_t to be a bool, but got int"),
    ],
)
def test_a_bad_config_is_refused_by_name(kwargs, error, match):
    from tritongemm.nn import Fp8TrainingConfig

    with pytest.raises(error, match=match):
        Fp8TrainingConfig(**kwargs)


def test_patch_leaves_what_a_recipe_cannot_take_with_the_reason():
    import tritongemm

    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 40)).to(DEVICE)
    tritongemm.patch(model, fp8_training="block")
    assert isinstance(model[0], Fp8TrainingLinear) and type(model[1]) is torch.nn.Linear
    assert "block scales need multiples of 128" in model.tritongemm_patch_report.skipped["1"]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(fp8_training="int8"), "expected fp8_training to be None, one of .* or an Fp8TrainingConfig"),
        (dict(fp8_training="row", fp8="row"), "expected fp8 unset"),
        (dict(fp8_training="row", fuse=True), "expected fuse unset"),
        (dict(fp8_training="row", batch_invariant=True), "expected batch_invariant unset"),
        (dict(fp8_training="row", kernel="naive"), "expected kernel unset"),
    ],
)
def test_patch_refuses_fp8_training_with_what_it_does_not_combine_with(kwargs, match):
    import tritongemm

    with pytest.raises(ValueError, match=match):
        tritongemm.patch(torch.nn.Sequential(torch.nn.Linear(16, 16)), **kwargs)


@pytest.mark.parametrize("recipe,wgrad", [("row", "fp8"), ("block", "bf16")])
def test_compile_fullgraph_gives_the_eager_steps_results(recipe, wgrad):
    """Under torch.compile(fullgraph=True) each GEMM is one tritongemm::fp8_product node and
    AOTAutograd traces the backward: the same forward and gradients as eager, bit for bit (the
    same kernels on the same operands). The bias gradient is a plain reduction, which Inductor
    generates with its own summation order: equal to rounding. aot_eager on the CPU (no C++
    compiler needed); Inductor on a GPU."""
    torch.manual_seed(12)
    layer = Fp8TrainingLinear(128, 256, device=DEVICE, recipe=recipe, wgrad=wgrad)
    x = _data((2, 5, 128), 13)
    dy = _data((2, 5, 256), 14, scale=1e-2)
    results = []
    for fn in (
        layer,
        torch.compile(layer, fullgraph=True, backend="inductor" if DEVICE.type == "cuda" else "aot_eager"),
    ):
        xi = x.clone().requires_grad_()
        layer.zero_grad(set_to_none=True)
        fn(xi).backward(dy)
        results.append((fn(xi).detach(), xi.grad, layer.weight.grad, layer.bias.grad))
    *fp8_results, bias_grads = zip(*results)
    for eager, compiled in fp8_results:
        assert torch.equal(eager, compiled)
    torch.testing.assert_close(*bias_grads, rtol=1e-5, atol=1e-6)


def test_activation_checkpointing_recomputes_the_same_step():
    torch.manual_seed(15)
    layer = Fp8TrainingLinear(48, 32, device=DEVICE, recipe="row")
    x = _data((7, 48), 16)
    grads = []
    for checkpointed in (False, True):
        xi = x.clone().requires_grad_()
        layer.zero_grad(set_to_none=True)
        y = torch.utils.checkpoint.checkpoint(layer, xi, use_reentrant=False) if checkpointed else layer(xi)
        y.square().sum().backward()
        grads.append((xi.grad, layer.weight.grad))
    assert all(torch.equal(a, b) for a, b in zip(*grads))
