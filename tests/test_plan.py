"""Launch plans: one per problem, found again for the same problem, never for another.

Each case changes one fact of a problem that the plan depends on and checks that the cache
misses (a different stride, alignment, dtype, device, offset pointer, out, kernel, config, TF32
switch), that it hits when only the data moves, that it stays bounded, shares safely between
threads and keeps no tensor alive. On the CPU the kernels run under the interpreter; on a GPU the
same tests run the compiled kernels through the direct launch path.
"""

import gc
import threading
import weakref

import pytest
import torch
from cases import DEVICE, ON_GPU

import tritongemm
from tritongemm.core import device_info
from tritongemm.core.config import MatmulConfig
from tritongemm.core.plans import PlanCache
from tritongemm.core.reference import reference_matmul, rel_error, tolerance
from tritongemm.dense.matmul import lookup
from tritongemm.dense.plan import problem_key
from tritongemm.primitives import launch as fast_launch
from tritongemm.primitives.launch import compiled_launches, split_parameters

SMALL = MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_SIZE_M=2, num_warps=4, num_stages=1)
F16, F32 = torch.float16, torch.float32


def rand(*shape, dtype=F16, offset=0):
    """A random (rows, cols) tensor whose data starts `offset` elements into its storage."""
    storage = torch.randn(offset + shape[0] * shape[1], device=DEVICE).to(dtype)
    return storage[offset:].view(shape)


def key(a, b, out=None, kernel="grouped", config=SMALL):
    return problem_key(a, b, out, kernel, config)


BASE = dict(a=lambda: rand(24, 40), b=lambda: rand(40, 16))
# (id, how the second problem differs from (24 x 40) @ (40 x 16) fp16, contiguous, aligned)
MISSES = [
    ("stride", lambda: (rand(40, 24).T, rand(40, 16))),
    ("padded_rows", lambda: (rand(24, 48)[:, :40], rand(40, 16))),
    ("offset_pointer", lambda: (rand(24, 40, offset=3), rand(40, 16))),
    ("offset_pointer_b", lambda: (rand(24, 40), rand(40, 16, offset=1))),
    ("dtype", lambda: (rand(24, 40, dtype=F32), rand(40, 16, dtype=F32))),
    ("shape_m", lambda: (rand(25, 40), rand(40, 16))),
    ("shape_n", lambda: (rand(24, 40), rand(40, 17))),
    ("negated_view", lambda: (torch._neg_view(rand(24, 40)), rand(40, 16))),
]


@pytest.mark.parametrize("name, second", MISSES, ids=[m[0] for m in MISSES])
def test_a_changed_fact_misses(name, second):
    first = key(BASE["a"](), BASE["b"]())
    assert key(*second()) != first


def test_moved_data_hits():
    """Same geometry, other memory (a new activation of the same shape): the same plan."""
    assert key(rand(24, 40), rand(40, 16)) == key(rand(24, 40), rand(40, 16))
    # 16-byte alignment is what counts, not the address: 8 fp16 elements in is aligned again.
    assert key(rand(24, 40, offset=8), rand(40, 16)) == key(rand(24, 40), rand(40, 16))


def test_out_kernel_config_and_tf32_are_in_the_key():
    a, b = rand(24, 40), rand(40, 16)
    plain = key(a, b)
    assert key(a, b, out=torch.empty(24, 16, device=DEVICE, dtype=F16)) != plain
    assert key(a, b, out=torch.empty(16, 24, device=DEVICE, dtype=F16).T) != key(
        a, b, out=torch.empty(24, 16, device=DEVICE, dtype=F16)
    )
    assert key(a, b, kernel="naive") != plain
    assert key(a, b, config=SMALL.with_(BLOCK_K=32)) != plain
    a32, b32 = rand(24, 40, dtype=F32), rand(40, 16, dtype=F32)
    torch.backends.cuda.matmul.allow_tf32 = False
    ieee = key(a32, b32)
    torch.backends.cuda.matmul.allow_tf32 = True  # the conftest fixture restores it
    assert key(a32, b32) != ieee


def test_spared_sms_are_in_the_key():
    """A persistent kernel's grid is planned from the SM count: a plan made while SMs are spared
    (the tensor-parallel ops' GEMMs) is never served outside, nor the other way round."""
    a, b = rand(24, 40), rand(40, 16)
    plain = key(a, b)
    with device_info.sparing_sms(1):
        spared = key(a, b)
        with device_info.sparing_sms(0):
            assert key(a, b) == plain
    assert spared != plain and key(a, b) == plain


def test_sparing_sms_lowers_the_count_in_this_thread_only(monkeypatch):
    monkeypatch.setattr(device_info, "_properties", lambda index: ((9, 0), 132, "a GPU", 50 << 20))
    monkeypatch.setattr(device_info, "_index", lambda device: 0)
    seen = {}
    with device_info.sparing_sms(2):
        assert device_info.sm_count("cuda") == 130 and device_info.spare_sms() == 2
        other = threading.Thread(target=lambda: seen.update(sms=device_info.sm_count("cuda")))
        other.start()
        other.join()
    assert seen["sms"] == 132 and device_info.sm_count("cuda") == 132
    with pytest.raises(ValueError, match="count to be an int >= 0, but got -1"):
        with device_info.sparing_sms(-1):
            pass


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for operands on two devices")
def test_device_is_in_the_key():
    a, b = rand(24, 40), rand(40, 16)
    assert key(a, b) != key(a.to("cuda:1"), b.to("cuda:1"))
    assert key(a, b) != key(a, b.to("cuda:1"))


def run(cache, a, b, out=None, kernel="grouped", config=SMALL):
    return lookup(a, b, out, kernel, config, cache=cache).run(a, b, out)


def test_a_hit_computes_the_new_data():
    cache = PlanCache()
    for _ in range(3):
        a, b = rand(24, 40), rand(40, 16)
        assert rel_error(run(cache, a, b), reference_matmul(a, b)) <= tolerance(F16, 40)
    assert cache.info() | {"capacity": 0} == dict(size=1, capacity=0, hits=2, misses=1, evictions=0)


def test_a_misaligned_second_call_gets_its_own_plan_and_the_right_answer():
    """The TMA kernels copy a misaligned operand; a plan built for an aligned one must not be
    reused for it (nor the other way round)."""
    cache = PlanCache()
    kernel, config = ("tma_persistent_pipelined", None) if _on_hopper() else ("grouped", SMALL)
    for offset in (0, 3, 0, 5):
        a, b = rand(64, 40, offset=offset), rand(40, 48)
        c = run(cache, a, b, kernel=kernel, config=config)
        assert rel_error(c, reference_matmul(a, b)) <= tolerance(F16, 40), offset
    assert cache.info()["misses"] == 2 and cache.info()["hits"] == 2


def test_the_cache_is_bounded_lru():
    cache = PlanCache(capacity=2)
    a = rand(8, 8)
    for n in (8, 16, 8, 24):  # 8 is used again before 24 arrives, so 16 is the one evicted
        run(cache, a, rand(8, n))
    assert cache.info()["size"] == 2 and cache.info()["evictions"] == 1
    run(cache, a, rand(8, 8))
    assert cache.info()["hits"] == 2  # 8 stayed
    run(cache, a, rand(8, 16))
    assert cache.info()["misses"] == 4  # 16 did not


def test_plans_keep_no_tensor_alive():
    cache = PlanCache()
    a, b = rand(24, 40), rand(40, 16)
    out = torch.empty(24, 16, device=DEVICE, dtype=F16)
    run(cache, a, b, out)
    alive = [weakref.ref(t) for t in (a, b, out)]
    del a, b, out
    gc.collect()
    assert all(ref() is None for ref in alive)


def test_threads_share_the_cache():
    """Four threads looking plans up (and, on a GPU, launching them) at once. The interpreter is
    not thread-safe, so on the CPU the plans run afterwards, one at a time."""
    cache = PlanCache(capacity=3)
    errors, done = [], []

    def worker(seed):
        try:
            for i in range(4):
                n = 8 * (1 + (seed + i) % 4)  # four geometries over three slots: hits, misses, evictions
                a, b = rand(16, 24), rand(24, n)
                plan = lookup(a, b, None, "grouped", SMALL, cache=cache)
                done.append((plan, a, b, plan.run(a, b, None) if ON_GPU else None))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for plan, a, b, c in done:
        c = plan.run(a, b, None) if c is None else c
        assert rel_error(c, reference_matmul(a, b)) <= tolerance(F16, 24)
    info = cache.info()
    assert info["size"] <= 3 and info["hits"] + info["misses"] == 16


def test_bad_input_is_still_refused_after_a_good_call():
    a, b = rand(24, 40), rand(40, 16)
    tritongemm.matmul(a, b, kernel="grouped", config=SMALL)
    with pytest.raises(ValueError, match="shapes cannot be multiplied"):
        tritongemm.matmul(a, rand(41, 16), kernel="grouped", config=SMALL)
    out = torch.empty(24, 16, device=DEVICE, dtype=F16)
    tritongemm.matmul(a, b, out=out, kernel="grouped", config=SMALL)
    with pytest.raises(ValueError, match="out overlaps the memory of input a"):
        tritongemm.matmul(a[:, :16], b[:16], out=a[:, 16:32], kernel="grouped", config=SMALL)
    with pytest.raises(ValueError, match="out is a negated view"):  # same geometry as the good out
        tritongemm.matmul(a, b, out=torch._neg_view(out), kernel="grouped", config=SMALL)
    with pytest.raises(TypeError, match="expected config to be None, a MatmulConfig or 'autotune'"):
        tritongemm.matmul(a, b, config={"BLOCK_M": 16})  # unhashable: no key, the checks answer


def test_every_kernel_passes_runtime_arguments_first():
    """The direct launch appends the constexprs after the runtime arguments (fast_launch)."""
    from tritongemm.ladder import grouped, naive, persistent, tma_persistent, tma_persistent_pipelined, tma_pipelined

    ladder = [naive._naive_kernel, grouped._grouped_kernel, persistent._persistent_kernel]
    epilogue = ["bias_ptr", "residual_ptr", "preact_ptr", "stride_rm", "stride_rn", "stride_pm", "alpha"]
    # ^ Epilogue.pointers, then Epilogue.fixed_args
    for kernel in ladder:
        assert split_parameters(kernel)[0][-8:] == ["trace_ptr", *epilogue]  # _host.planned_launch's order
    gluon = [
        tma_pipelined._tma_pipelined_kernel,
        tma_persistent._tma_persistent_kernel,
        tma_persistent_pipelined._tma_persistent_pipelined_kernel,
    ]
    for kernel in gluon:
        assert split_parameters(kernel)[0] == ["a_desc", "b_desc", "c_desc", *epilogue]  # descriptors.planned_launch's
    # Rung 9 then takes fp8's scale pointers: planned_launch's `trailing` (bf16), fp8_ws's scales.
    from tritongemm.ladder.tma_warp_specialized import _tma_warp_specialized_kernel

    runtime = split_parameters(_tma_warp_specialized_kernel)[0]
    assert runtime == ["a_desc", "b_desc", "c_desc", *epilogue, "sa_ptr", "sb_ptr"]


@pytest.mark.skipif(not ON_GPU, reason="the direct launch path exists for compiled kernels only")
@pytest.mark.parametrize("kernel", ["naive", "grouped", "persistent", "tma_pipelined", "tma_persistent_pipelined"])
def test_gpu_plans_launch_directly(kernel):
    if kernel.startswith("tma") and not _on_hopper():
        pytest.skip("needs an sm_90 GPU")
    cache = PlanCache()
    a, b = rand(300, 200), rand(136, 200).T
    c = run(cache, a, b, kernel=kernel, config=None)
    assert rel_error(c, reference_matmul(a, b)) <= tolerance(F16, 200)
    plan = lookup(a, b, None, kernel, None, cache=cache)
    launches = compiled_launches(plan.launch)
    assert launches and all(launch.direct for launch in launches)
    # On a launcher layout the direct path speaks (3.6's, 3.7-3.9's), the cheapest path: TMA
    # descriptors encoded from the plan's fields, other kernels the launcher's C entry point.
    # Elsewhere Triton's own launcher for the binary compiled once, and no guessing at its layout.
    measured = fast_launch.launcher_layout() is not None
    if kernel.startswith("tma"):
        assert all(launch.encodes_descriptors == measured for launch in launches)
    else:
        assert all(launch.raw == measured for launch in launches)


@pytest.mark.skipif(not ON_GPU, reason="TMA descriptors are encoded on the GPU only")
def test_gpu_tma_descriptors_follow_the_addresses():
    """A TMA plan reuses an operand's previous encoding at the same address only (fast_launch):
    operands and outputs that swap addresses, and new data at an old address, compute right."""
    if not _on_hopper():
        pytest.skip("needs an sm_90 GPU")
    cache = PlanCache()
    a1, a2, b1, b2 = rand(64, 40), rand(64, 40), rand(40, 48), rand(40, 48)
    out1, out2 = (torch.empty(64, 48, device=DEVICE, dtype=F16) for _ in range(2))
    for a, b, out in [(a1, b1, out1), (a2, b1, out2), (a1, b2, out2), (a2, b2, out1), (a1, b1, out1)]:
        a.normal_()  # new data, maybe at the address of the previous call
        out.fill_(float("nan"))
        run(cache, a, b, out=out, kernel="tma_persistent_pipelined", config=None)
        assert rel_error(out, reference_matmul(a, b)) <= tolerance(F16, 40)
    for b in (b1, b2, b1):  # and fresh outputs, wherever the allocator puts them
        c = run(cache, a1, b, kernel="tma_persistent_pipelined", config=None)
        assert rel_error(c, reference_matmul(a1, b)) <= tolerance(F16, 40)


@pytest.mark.skipif(not ON_GPU, reason="TMA descriptors are encoded on the GPU only")
def test_gpu_tma_encodings_past_their_bound(monkeypatch):
    """More addresses than an operand keeps encodings for (fast_launch.ENCODINGS_PER_OPERAND, 2
    here): the kept ones are dropped and encoded again, and every call computes right."""
    if not _on_hopper():
        pytest.skip("needs an sm_90 GPU")
    from tritongemm.primitives import launch as fast_launch

    monkeypatch.setattr(fast_launch, "ENCODINGS_PER_OPERAND", 2)
    cache = PlanCache()
    weights = [rand(40, 48) for _ in range(5)]
    a = rand(64, 40)
    for b in weights + weights[::-1] + weights:
        b.normal_()
        c = run(cache, a, b, kernel="tma_persistent_pipelined", config=None)
        assert rel_error(c, reference_matmul(a, b)) <= tolerance(F16, 40)


def _on_hopper() -> bool:
    return ON_GPU and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("limit", ["ValueError", "OutOfResources"])
def test_a_table_winner_the_kernel_refuses_leaves_the_choice_to_the_rules(monkeypatch, limit):
    """A bucket's winner was measured on another problem in the bucket; a kernel limit (a grid
    axis: ValueError; shared memory, found by the compiler: OutOfResources) may refuse it for this
    one: then the rules choose, as without a table."""
    from triton.runtime.errors import OutOfResources

    from tritongemm.dense import build as plan
    from tritongemm.dispatch import table as dispatch_table

    choice = dispatch_table.Choice("grouped", SMALL, dispatch_table.TABLE + "test: measured elsewhere")
    monkeypatch.setattr(dispatch_table, "lookup", lambda a, b: choice)
    built, real = [], plan._compiled_plan

    def refuse_the_tables(problem, info, config, *rest):
        built.append((info.name, config))
        if config is SMALL:
            raise ValueError("grouped: a limit") if limit == "ValueError" else OutOfResources(1, 0, "shared memory")
        return real(problem, info, config, *rest)

    monkeypatch.setattr(plan, "_compiled_plan", refuse_the_tables)
    a, b = rand(24, 40), rand(40, 16)
    chosen = lookup(a, b, None, "auto", None, cache=PlanCache())
    rules = tritongemm.dispatch.choose("auto", None, a, b, F16, use_table=False)[0].name
    assert built == [("grouped", SMALL), (rules, None)] and chosen.kernel == rules
    assert rel_error(chosen.run(a, b, None), reference_matmul(a, b)) <= tolerance(F16, 40)


def test_a_default_config_too_big_for_shared_memory_takes_fewer_stages(monkeypatch):
    """The defaults size shared memory for the operands; an fp32 output's epilogue can tip a
    persistent kernel over (H100: bf16 to fp32 at 512 x 28672 x 4096). The plan retries its
    default with fewer stages; a config the caller gave fails as asked."""
    from triton.runtime.errors import OutOfResources

    from tritongemm import dispatch
    from tritongemm.core import registry
    from tritongemm.ladder import grouped as grouped_rung

    grouped = registry.get("grouped")
    real_plan = grouped_rung.plan
    tried = []

    def plan_in_little_memory(a, b, c, config, **epilogue):
        tried.append(config.num_stages)
        if config.num_stages > 2:
            raise OutOfResources(config.num_stages * 100_000, 232_448, "shared memory")
        return real_plan(a, b, c, config, **epilogue)

    monkeypatch.setattr(grouped_rung, "plan", plan_in_little_memory)
    a, b = (torch.randn(s, device=DEVICE) for s in ((33, 40), (40, 17)))
    default = dispatch.default_config(grouped, a.dtype, 33, 17, 40, a.device).with_(num_stages=4)
    monkeypatch.setattr(dispatch, "default_config", lambda *args: default)
    cache = PlanCache()
    plan = lookup(a, b, None, "grouped", None, cache=cache)
    assert tried == [4, 3, 2] and plan.config == default.with_(num_stages=2)
    torch.testing.assert_close(plan.run(a, b, None), a @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(OutOfResources):
        lookup(a, b, None, "grouped", default, cache=cache)
