"""bench decode's plumbing on the CPU: a tiny model under the interpreter, eager steps (CUDA graphs
are the GPU's), every provider checked against torch and against its own fp64 product."""

import csv
import importlib.util

import pytest
import torch
from cases import DEVICE, ON_GPU

from tritongemm.bench import decode
from tritongemm.bench.model import build_base, family_config
from tritongemm.fp8.linear import Fp8Linear

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="bench decode builds transformers models"
)
SHAPE = decode.Shape(batches=(1, 3), prompt=8, new_tokens=4)


def _tiny(family="llama-3-8b", device="cpu"):
    config = family_config(family, 2, 96, dims=decode.CPU_SMOKE)
    return build_base(family, config, device=device, dtype=torch.float32)


@pytest.mark.parametrize(
    "models, providers, message",
    [
        (("gpt2",), ("torch",), "--models: expected names from"),
        (("mixtral-8x7b-moe",), ("torch",), "expected dense families"),
        (("llama-3-8b",), ("tritongemm",), "must include torch"),
        (("llama-3-8b",), ("torch", "torch.compile"), "--providers: expected names from"),
    ],
)
def test_bad_arguments_are_named(models, providers, message):
    with pytest.raises(ValueError, match=message):
        decode.check_arguments(models, providers)


def test_bad_batches_are_named():
    with pytest.raises(ValueError, match=r"--batches: expected integers >= 1, but got \(0,\)"):
        decode.check_arguments(("llama-3-8b",), ("torch",), (0,))


@needs_transformers
@pytest.mark.skipif(ON_GPU, reason="the CPU's smoke run")
def test_batches_replace_the_shapes_own(tmp_path):
    """--batches: a run of some of the batches (a whole GPU run is more than a device call's 10 minutes)."""
    rows = decode.run_decode(models=("llama-3-8b",), providers=("torch",), batches=(2,), out_dir=None, shape=SHAPE)
    assert [(r.batch, r.status) for r in rows] == [(2, "ok")]


@needs_transformers
@pytest.mark.skipif(ON_GPU, reason="the CPU's smoke run; the GPU's is the suite itself")
def test_a_tiny_decode_runs_every_provider_and_checks_it(tmp_path):
    rows = decode.run_decode(models=("llama-3-8b",), providers=("torch", "tritongemm", "fp8-row"), out_dir=tmp_path,
                             shape=SHAPE)  # fmt: skip
    assert [(r.batch, r.provider) for r in rows] == [(b, p) for b in (1, 3) for p in ("torch", "tritongemm", "fp8-row")]
    assert all(r.status == "ok" and r.ms_per_token > 0 for r in rows), [r.status for r in rows]
    for r in rows:
        assert r.tokens_per_s == pytest.approx(r.batch / (r.ms_per_token * 1e-3))
        # fp32 GEMMs, each provider against the fp64 product of its own weights (fp8: quantized)
        assert r.kernel_rel_err < 1e-5, r
        if r.provider == "torch":
            assert r.ratio_to_torch == 1.0 and r.logits_rel_err == 0.0 and r.matching_tokens == SHAPE.new_tokens
        elif r.provider == "tritongemm":
            assert r.logits_rel_err < 1e-5 and r.matching_tokens == SHAPE.new_tokens
        else:  # fp8: the quantization's error, far above the kernel's
            assert 1e-3 < r.logits_rel_err < 0.25
        assert r.gemm_share is None and r.weight_GBps is None  # profiled on a GPU only
    with open(tmp_path / "decode-cpu.csv") as f:
        written = list(csv.DictReader(f))
    assert list(written[0])[:3] == ["device", "triton", "model"] and len(written) == len(rows)


def _greedy_without_cache(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """n greedy tokens, each from a forward over the whole sequence so far: no cache to get wrong.
    Not `generate`: its min_new_tokens masks the config's eos token (2 here), which a random
    model's argmax may pick."""
    seq = prompt
    for _ in range(n):
        seq = torch.cat([seq, model(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return seq[:, prompt.shape[1] :]


@needs_transformers
def test_a_reset_replays_the_same_tokens():
    """The loop's state is in tensors (ids, pos, the cache's own count): a reset makes a second run
    of the same steps give the same tokens, the first of them the prefill's, and they are greedy
    decoding's over the whole sequence."""
    torch.manual_seed(22)  # a model whose greedy tokens include the eos token
    model = _tiny()
    prompt = torch.randint(0, 96, (2, SHAPE.prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        loop = decode.DecodeLoop(model, prompt, SHAPE.new_tokens, capture=False)
        first, second = loop.run(), loop.run()
        expected = _greedy_without_cache(model, prompt, SHAPE.new_tokens)
    assert torch.equal(first, second)
    assert torch.equal(first, expected)


def test_matching_tokens_is_the_mean_leading_agreement():
    ref = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert decode.matching_tokens(ref, ref) == 4
    assert decode.matching_tokens(torch.tensor([[1, 2, 0, 4], [0, 6, 7, 8]]), ref) == 1.0  # (2 + 0) / 2


@needs_transformers
def test_weight_bytes_count_each_gemm_weight_once():
    """bf16: every Linear's weight (the lm_head included, the embedding not); fp8 row-wise: one
    byte a weight plus the fp32 scales; the fused q/k/v and gate/up weights instead of theirs."""
    import tritongemm
    from tritongemm.bench.model import sharing_copy

    model = _tiny(device=DEVICE)  # where patch converts: a CPU model on a GPU machine is left as it is
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    elements = sum(m.weight.numel() for m in linears)
    assert decode.weight_bytes(model) == 4 * elements
    fused = tritongemm.patch(sharing_copy(model), fuse=True)
    assert decode.weight_bytes(fused) == 4 * elements
    fp8 = tritongemm.patch(sharing_copy(model), fp8="row")
    scales = sum(m.weight_scale.numel() * 4 for m in fp8.modules() if isinstance(m, Fp8Linear))
    assert decode.weight_bytes(fp8) == elements + scales


@needs_transformers
def test_each_fp8_layer_is_checked_against_the_fp64_product_of_its_own_input():
    """fp8_layer_errors: every Fp8Linear of the step, its output against _Fp8Reference of the
    input it was given (fp32 here: well inside the bound), the base's parameters left as they are;
    a layer whose output is off by 1% is past its bound."""
    import tritongemm
    from tritongemm.bench.model import sharing_copy

    model = _tiny(device=DEVICE)
    fp8 = tritongemm.patch(sharing_copy(model), fp8="row", fuse=True)
    layers = [name for name, m in fp8.named_modules() if isinstance(m, Fp8Linear)]
    prompt = torch.randint(0, 96, (3, SHAPE.prompt), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.inference_mode():
        loop = decode.DecodeLoop(fp8, prompt, SHAPE.new_tokens, capture=False)
        found = decode.fp8_layer_errors(loop, loop.first, sequences=2)
        assert [name for name, _, _ in found] == layers and len(layers) > 0
        # Against the fp64 product of the same fp8 operands only the accumulation differs: exact
        # fp32 under the interpreter (about 1e-7), Hopper's fp8 tensor-core sums on the GPU
        # (6e-5 to 1e-4 on the H200), both well inside the bound of 1e-3.
        assert all(err < bound / 4 for _, err, bound in found), found
        assert all(p.dtype == torch.float32 for p in model.parameters())
        fp8.get_submodule(layers[0]).register_forward_hook(lambda m, args, out: out * 1.01)
        (name, err, bound), *_ = decode.fp8_layer_errors(loop, loop.first, sequences=2)
    assert name == layers[0] and err > bound


@needs_transformers
@pytest.mark.skipif(ON_GPU, reason="the CPU's smoke run")
def test_a_wrong_provider_is_reported_and_not_timed(monkeypatch):
    """A provider whose step is off its own fp64 product (here a model whose lm_head is doubled)
    gets a "wrong" row with no timing; the others are measured as usual."""
    import copy

    real = decode.provider_model

    def broken(base, provider):
        if provider != "tritongemm":
            return real(base, provider)
        wrong = copy.deepcopy(base)
        wrong.lm_head.weight.data.mul_(2)
        return wrong

    monkeypatch.setattr(decode, "provider_model", broken)
    shape = decode.Shape(batches=(2,), prompt=8, new_tokens=4)
    rows = decode.run_decode(models=("llama-3-8b",), providers=("torch", "tritongemm"), out_dir=None, shape=shape)
    (ok, wrong) = rows
    assert ok.status == "ok" and ok.ms_per_token > 0
    assert wrong.status.startswith("wrong: the first step's logits") and wrong.ms_per_token is None
