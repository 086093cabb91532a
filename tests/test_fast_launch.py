"""fast_launch's three paths, on a stand-in for Triton's compiled kernel: the launcher's C entry
point, Triton's Python launcher (when a profiler's hooks are installed, or the entry point
refuses the arguments), and `kernel[grid](...)` (when the launcher refuses them too). The real
launcher is exercised on the GPU (test_plan.py's test_gpu_plans_launch_directly)."""

from __future__ import annotations

import functools

import pytest
import torch
import triton
from triton import knobs

from tritongemm.primitives import launch as fast_launch

STREAM = 7


class _Recorder:
    def __init__(self, refuse: bool = False):
        self.calls, self.refuse = [], refuse

    def __call__(self, *args):
        if self.refuse:
            raise TypeError("function takes exactly 17 arguments")
        self.calls.append(args)


class _FakeLauncher(_Recorder):
    """CudaLauncher's shape: `launch` is the C function (no __code__), no scratch; 3.7+'s also
    carry the argument annotations and kernel signature the C function is handed."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True
    arg_annotations, kernel_signature = ("annotations",), ("signature",)

    def __init__(self, c_entry: _Recorder, refuse: bool = False):
        super().__init__(refuse)
        self.launch = functools.partial(c_entry)  # a partial has no __code__, as a builtin has none


class _FakeCompiled:
    function, packed_metadata = 1234, ("packed",)

    def __init__(self, run: _FakeLauncher):
        self.run = run

    def launch_metadata(self, grid, stream, *args):
        return {"grid": grid}


class _FakeJit:
    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


@pytest.fixture(params=["positional", "packed"])
def fake_cuda(monkeypatch, request):
    """A stream, and this Triton taken to have each of the launcher layouts the direct path speaks."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: STREAM, raising=False)
    monkeypatch.setattr(fast_launch, "LAUNCHER_LAYOUTS", {triton.__version__: request.param})
    return request.param


def _launch(c_entry, launcher_refuses=False):
    compiled = _FakeCompiled(_FakeLauncher(c_entry, refuse=launcher_refuses))
    jit = _FakeJit()
    constexprs, options = {"BLOCK": 64, "ALIGN": (1, 8)}, {"num_warps": 4}
    return fast_launch.CompiledLaunch(jit, (3, 2), constexprs, options, compiled, 0), compiled, jit


def test_the_c_entry_point_gets_every_argument_in_triton_order(fake_cuda):
    c_entry = _Recorder()
    launch, compiled, jit = _launch(c_entry)
    assert launch.raw and launch.direct
    launch("a", "b", 5)
    if fake_cuda == "positional":  # 3.6: scratch first, then metadata and hooks, the parameters one by one
        head = (3, 2, 1, STREAM, 1234, False, True, None, None, ("packed",), None, None, None)
        assert c_entry.calls == [(*head, "a", "b", 5, 64, (1, 8))]
    else:  # 3.7+: metadata and hooks, scratch, the launcher's annotations and signature, the parameters as a tuple
        head = (3, 2, 1, STREAM, 1234, False, True, ("packed",), None, None, None, None, None)
        assert c_entry.calls == [(*head, ("annotations",), ("signature",), ("a", "b", 5, 64, (1, 8)))]
    assert compiled.run.calls == [] and jit.calls == []


def test_a_profiler_gets_triton_launcher_with_metadata(fake_cuda, monkeypatch):
    c_entry = _Recorder()
    launch, compiled, _ = _launch(c_entry)
    hook = lambda metadata: None  # noqa: E731
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
    launch("a")
    assert c_entry.calls == []
    (call,) = compiled.run.calls
    assert call[:7] == (3, 2, 1, STREAM, 1234, ("packed",), {"grid": (3, 2, 1)}) and call[7] is hook


def test_a_refused_c_entry_point_warns_and_falls_back_for_good(fake_cuda):
    c_entry = _Recorder(refuse=True)
    launch, compiled, _ = _launch(c_entry)
    with pytest.warns(RuntimeWarning, match="direct launch refused"):
        launch("a")
    assert not launch.raw and len(compiled.run.calls) == 1
    launch("b")  # no second try, and no second warning (pyproject makes ours errors)
    assert len(compiled.run.calls) == 2 and compiled.run.calls[1][-3:] == ("b", 64, (1, 8))


def test_a_refusing_launcher_falls_back_to_the_jit_function(fake_cuda):
    launch, compiled, jit = _launch(_Recorder(refuse=True), launcher_refuses=True)
    with pytest.warns(RuntimeWarning) as warned:
        launch("a", "b")
    assert len(warned) == 2 and not launch.direct
    assert jit.calls == [((3, 2, 1), ("a", "b"), {"BLOCK": 64, "ALIGN": (1, 8), "num_warps": 4})]


def test_other_triton_releases_take_triton_launcher(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: STREAM, raising=False)
    monkeypatch.setattr(fast_launch, "LAUNCHER_LAYOUTS", {"0.0.": "packed"})
    c_entry = _Recorder()
    launch, compiled, _ = _launch(c_entry)
    assert not launch.raw
    launch("a")
    assert c_entry.calls == [] and len(compiled.run.calls) == 1


def test_the_layouts_are_named_by_release():
    assert fast_launch.launcher_layout("3.6.0") == "positional"
    assert [fast_launch.launcher_layout(v) for v in ("3.7.1", "3.8.0", "3.9.0")] == ["packed"] * 3
    assert fast_launch.launcher_layout("3.10.0") is None and fast_launch.launcher_layout("4.0.0") is None


class _OldShapedLauncher(_FakeLauncher):
    """A launcher without 3.7+'s annotations and signature: not the layout its release claims."""

    def __getattribute__(self, name):
        if name in ("arg_annotations", "kernel_signature"):
            raise AttributeError(name)
        return super().__getattribute__(name)


@pytest.mark.parametrize("state", ["sanitized", "no annotations"])
def test_a_launcher_the_direct_path_cannot_speak_takes_triton_path(monkeypatch, state):
    """A launcher under GSan appends the sanitizer's state to the arguments; one without 3.7+'s
    annotations is not the layout its release claims: both go through Triton's launcher."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: STREAM, raising=False)
    monkeypatch.setattr(fast_launch, "LAUNCHER_LAYOUTS", {triton.__version__: "packed"})
    c_entry = _Recorder()
    launcher = _FakeLauncher(c_entry) if state == "sanitized" else _OldShapedLauncher(c_entry)
    launcher.gsan_enabled = state == "sanitized"
    compiled = _FakeCompiled(launcher)
    launch = fast_launch.CompiledLaunch(_FakeJit(), (1,), {}, {}, compiled, 0)
    assert launch.direct and not launch.raw
    launch("a")
    assert c_entry.calls == [] and len(launcher.calls) == 1
