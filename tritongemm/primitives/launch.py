"""Launching a compiled Triton or Gluon kernel without Triton's per-call work.

`kernel[grid](*args)` binds the arguments, computes their specialization (which integers are
multiples of 16, which pointers are aligned) and looks the compiled kernel up, on every call:
14-26 us of Python on the H100 machine, where the compiled kernel's own launcher takes 5.5 us
(triton 3.6, a 13-argument ladder kernel). A launch plan knows the specialization once, since it
is built per problem geometry: `compile_launch` compiles the kernel for one call's arguments and
returns a `CompiledLaunch` that launches the same binary for later tensors of that geometry.

Triton's launcher API is internal and moves between releases, so everything that touches it
lives here, and a launcher that rejects our arguments makes this plan fall back to
`kernel[grid](...)` for good (right, only slower), as does the interpreter, which compiles nothing.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Callable

import torch
import triton
from triton import knobs
from triton.compiler import compiler
from triton.runtime.errors import OutOfResources

# How the compiled launcher's C entry point takes a launch, by Triton release (the call at the
# end of backends/nvidia/driver.py's CudaLauncher.__call__), after (grid x, y, z, stream, function,
# cooperative grid, programmatic dependent launch):
# - "positional", 3.6: global scratch, profile scratch, packed metadata, launch metadata, the two
#   hooks, then every kernel parameter as an argument of its own;
# - "packed", 3.7 to 3.9: packed metadata, launch metadata, the two hooks, global scratch, profile
#   scratch, the launcher's argument annotations and kernel signature, then every parameter in one
#   tuple. Read in each release's source; 3.6 and 3.8 are checked on the GPU (tests/test_plan.py).
# Other releases take Triton's own launcher: right, and a few microseconds slower a call.
LAUNCHER_LAYOUTS = {"3.6.": "positional", "3.7.": "packed", "3.8.": "packed", "3.9.": "packed"}


def launcher_layout(version: str | None = None) -> str | None:
    """The layout of this (or `version`'s) Triton's C launcher that the direct path speaks, or None."""
    version = version or triton.__version__
    return next((layout for prefix, layout in LAUNCHER_LAYOUTS.items() if version.startswith(prefix)), None)


# Encodings kept per TMA operand of a plan, by address: a 32-layer model's q and o projections
# share one plan's B (64 weights). A few hundred bytes an encoding: under 100 KB a plan.
ENCODINGS_PER_OPERAND = 64


class CompiledLaunch:
    """`launch(*runtime_args)`: the kernel compiled for one problem geometry, launched on the
    current stream with new runtime arguments (the non-constexpr parameters, in order).

    The caller guarantees every runtime argument specializes as the ones it was compiled with did
    (same sizes and strides, pointers with the same 16-byte alignment): the plan key does.
    """

    def __init__(self, jit_fn, grid: tuple[int, ...], constexprs: dict, options: dict, compiled, device_index: int):
        self._jit_fn = jit_fn
        self._grid = tuple(grid) + (1,) * (3 - len(grid))
        self._jit_kwargs = {**constexprs, **options}  # what the fallback path passes by name
        self._constexpr_tail = tuple(constexprs.values())  # in parameter order; Triton's launcher takes them, unused
        self._compiled = compiled
        self._device_index = device_index
        self.direct = compiled is not None  # False: every call goes through kernel[grid](...)
        self.encodes_descriptors = False  # with_descriptors encodes TMA descriptors itself
        raw = _raw_launcher(compiled)
        # The launcher's C entry point, for a kernel without descriptor arguments: Triton's Python
        # wrapper around it (CudaLauncher.__call__) only allocates scratch buffers, which the
        # kernels here don't use (_raw_launcher checks), and costs microseconds of Python per call
        # (BENCHMARKS.md, "Host time per call").
        self._raw_plain = raw[0] if raw is not None and not raw[1] else None
        self.raw = self._raw_plain is not None  # what the tests check: the cheapest path is taken
        self._packs = launcher_layout() == "packed"  # the parameters go in one tuple
        # The launcher's arguments before the kernel's, no hooks (see __call__), wherever the C
        # launcher is reachable (with_descriptors uses them too).
        self._raw_head = _raw_head(compiled) if raw is not None else ()

    def __call__(self, *runtime_args) -> None:
        raw = self._raw_plain
        if raw is not None and not _profiling():  # the common case, kept to the fewest steps
            stream = torch._C._cuda_getCurrentRawStream(self._device_index)
            try:
                if self._packs:
                    raw(*self._grid, stream, *self._raw_head, (*runtime_args, *self._constexpr_tail))
                else:
                    raw(*self._grid, stream, *self._raw_head, *runtime_args, *self._constexpr_tail)
                return
            except TypeError as exc:  # parsed before anything launches: Triton's wrapper from now on
                self._raw_plain, self.raw = None, False
                warnings.warn(f"tritongemm: direct launch refused ({exc}); using Triton's launcher",
                              RuntimeWarning, stacklevel=2)  # fmt: skip
        if not self.direct:
            self._jit_fn[self._grid](*runtime_args, **self._jit_kwargs)
            return
        compiled = self._compiled
        stream = torch._C._cuda_getCurrentRawStream(self._device_index)
        args = (*runtime_args, *self._constexpr_tail)  # every parameter, as JITFunction.run passes them
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if _hooked(enter) or _hooked(leave):  # a profiler's: it reads the launch metadata
            metadata = compiled.launch_metadata(self._grid, stream, *args)
        else:  # None spares the launcher two calls of an empty hook chain
            metadata = enter = leave = None
        grid_x, grid_y, grid_z = self._grid
        try:
            compiled.run(grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata, metadata,
                         enter, leave, *args)  # fmt: skip
        except TypeError as exc:  # the launcher parses its arguments before launching anything
            self.direct = False
            warnings.warn(
                f"tritongemm: this Triton's kernel launcher did not take a direct launch ({exc}); "
                "falling back to kernel[grid](...), which costs more host time per call",
                RuntimeWarning,
                stacklevel=2,
            )
            self(*runtime_args)

    def with_descriptors(self, descriptors: tuple, rebase) -> Callable[..., None]:
        """`launch(*tensors, *rest)` for a kernel whose first runtime arguments are TMA
        `descriptors`, each moved onto the corresponding tensor of the call (same geometry, new
        address); the `rest` of the runtime arguments are passed as they are.

        Triton's launcher turns each host descriptor into a CUtensorMap on every call, in Python
        (about 1.5 us a descriptor on the H100 machine, plus the copy `rebase` makes); encoding
        it here from the plan's fixed fields costs the driver call alone (0.56 us). And each
        operand keeps the encodings of the addresses it was last called at (ENCODINGS_PER_OPERAND):
        the weights of the layers that share a plan's geometry, each always at its address, and the
        few blocks the caching allocator hands out again for activations and outputs. The plan's
        fixed fields and the address are all an encoding holds, so an equal address gives an equal
        descriptor. Where this Triton's launcher is not the one that was measured, descriptors take
        Triton's own path.
        """
        unbound = tuple(rebase(d, None) for d in descriptors)  # the plan must not keep tensors alive
        encode = self._descriptor_encoding(descriptors)
        self.encodes_descriptors = encode is not None
        count = len(descriptors)
        if encode is None:
            return lambda *args: self(*map(rebase, unbound, args[:count]), *args[count:])
        raw, specs, fill = encode
        grid_x, grid_y, grid_z = self._grid
        head, packs = self._raw_head, self._packs
        encodings = [{} for _ in specs]  # per operand: address -> its encoded descriptor

        def launch(*given) -> None:
            tensors, rest = given[:count], given[count:]
            # A profiler wants launch metadata: Triton's own path provides it.
            if not self.encodes_descriptors or _profiling():
                self(*map(rebase, unbound, tensors), *rest)
                return
            args = []
            for i, t in enumerate(tensors):
                address, known = t.data_ptr(), encodings[i]
                encoded = known.get(address)
                if encoded is None:
                    encoded = fill(address, *specs[i][0])
                    if len(known) >= ENCODINGS_PER_OPERAND:  # the bound; a thread looking up meanwhile
                        known.clear()  # misses, and encodes again
                    known[address] = encoded
                args.append(encoded)
                args.extend(specs[i][1])
            stream = torch._C._cuda_getCurrentRawStream(self._device_index)
            try:  # no hooks: None, as above
                if packs:
                    raw(grid_x, grid_y, grid_z, stream, *head, (*args, *rest, *self._constexpr_tail))
                else:
                    raw(grid_x, grid_y, grid_z, stream, *head, *args, *rest, *self._constexpr_tail)
            except TypeError as exc:  # parsed before anything launches: take Triton's path from now on
                self.encodes_descriptors = False
                warnings.warn(f"tritongemm: direct TMA launch refused ({exc}); using Triton's", RuntimeWarning, 2)
                self(*map(rebase, unbound, tensors), *rest)

        return launch

    def _descriptor_encoding(self, descriptors):
        """(raw launcher, per descriptor (encode fields, shape + strides), the driver's encoder), or
        None where this Triton's launcher has no layout the direct path speaks (see _raw_launcher)
        or a descriptor needs what the encoding here leaves out."""
        raw = _raw_launcher(self._compiled)
        if raw is None:
            return None
        raw, metadata = raw
        # The descriptors must be the first parameters and the only descriptor ones: `launch`
        # passes their encodings first, then the other arguments as they are.
        signature = list(getattr(self._compiled.src, "signature", {}).values())
        is_descriptor = [isinstance(kind, str) and kind.startswith("tensordesc") for kind in signature]
        if (
            not metadata
            or len(metadata) != len(descriptors)
            or is_descriptor[: len(descriptors)] != [True] * len(descriptors)
            or any(is_descriptor[len(descriptors) :])
        ):
            return None
        try:
            from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
        except ImportError:
            return None
        utils = triton.runtime.driver.active.utils
        # 3.7 renamed the encoder when it added im2col descriptors beside the tiled ones.
        fill = getattr(utils, "fill_tma_descriptor_tiled", None) or getattr(utils, "fill_tma_descriptor", None)
        if fill is None:
            return None
        specs = []
        for desc, meta in zip(descriptors, metadata):
            # fp4's padded rows, im2col boxes and fp32 read as tf32 change the encoding: Triton's path.
            if meta is None or meta.get("fp4_padded") or meta.get("is_im2col"):
                return None
            if getattr(desc, "round_f32_to_tf32", False):
                return None
            shape, strides = list(desc.shape), list(desc.strides)
            padding = 1 if desc.padding == "nan" else 0
            fields = (meta["swizzle"], meta["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
                      meta["block_size"], shape, strides, padding)  # fmt: skip
            specs.append((fields, (*shape, *strides)))
        return raw, tuple(specs), fill


def _raw_head(compiled) -> tuple:
    """The C launcher's arguments between the stream and the kernel's parameters, in this
    Triton's layout (LAUNCHER_LAYOUTS): no scratch buffers, no launch metadata, no hooks."""
    run = compiled.run
    common = (compiled.function, run.launch_cooperative_grid, run.launch_pdl)
    if launcher_layout() == "packed":
        return (*common, compiled.packed_metadata, None, None, None, None, None, run.arg_annotations,
                run.kernel_signature)  # fmt: skip
    return (*common, None, None, compiled.packed_metadata, None, None, None)


def _raw_launcher(compiled) -> tuple[Callable, list | None] | None:
    """(the compiled launcher's C entry point, its TMA descriptor metadata or None), where this
    Triton's launcher has a layout the direct path speaks (LAUNCHER_LAYOUTS), in the shape of
    backends/nvidia/driver.py's: a `CudaLauncher` whose `launch` is the C function itself, or a
    `wrap_handle_tensordesc` closure around it for a kernel with descriptor arguments; and no
    scratch buffers to allocate and no sanitizer state to pass per call. Else None."""
    layout = launcher_layout()
    if compiled is None or layout is None:
        return None
    launcher = compiled.run
    wrapper = getattr(launcher, "launch", None)
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
        return None
    if getattr(launcher, "gsan_enabled", False):  # 3.8+'s GSan appends its state to the arguments
        return None
    if layout == "packed" and not (hasattr(launcher, "arg_annotations") and hasattr(launcher, "kernel_signature")):
        return None
    if not hasattr(wrapper, "__code__"):  # a builtin: the C launcher itself
        return (wrapper, None) if callable(wrapper) else None
    names = wrapper.__code__.co_freevars
    cells = dict(zip(names, (cell.cell_contents for cell in wrapper.__closure__ or ())))
    raw, metadata = cells.get("launcher"), cells.get("tensordesc_meta")
    return None if raw is None or metadata is None else (raw, metadata)


def compile_launch(jit_fn, grid: tuple[int, ...], args: tuple, kwargs: dict, device: torch.device) -> CompiledLaunch:
    """Compile `jit_fn` for `jit_fn[grid](*args, **kwargs)` on `device` (or find it compiled) and
    return its launcher. `args` are the runtime arguments, in the kernel's parameter order;
    `kwargs` the constexprs and launch options (num_warps, ...)."""
    runtime, constexpr_names = split_parameters(jit_fn)
    constexprs = {name: kwargs[name] for name in constexpr_names if name in kwargs}
    options = {name: value for name, value in kwargs.items() if name not in constexprs}
    compiled = None
    # The direct path passes the runtime arguments, then every constexpr in order (Triton's
    # launcher parses and ignores them): true of every kernel here, checked so a new one can't break it.
    if device.type == "cuda" and len(args) == len(runtime) and len(constexprs) == len(constexpr_names):
        # One plan build at a time: Triton loads a compiled binary on first use without a lock,
        # publishing its launcher before its function handle, so a second thread could read the
        # handle as None (seen on the H100 in tests/gpu/test_concurrency.py) and launch nothing.
        with _COMPILE_LOCK, torch.cuda.device(device):
            compiled = jit_fn.warmup(*args, grid=grid, **kwargs)
            if hasattr(compiled, "result"):  # Triton's asynchronous compile mode hands back a future
                compiled = compiled.result()
            # Checked here, not left to the load: Triton raises OutOfResources at a binary's first
            # load only, then keeps the error as the binary's launcher, so a second plan of the same
            # binary would load "nothing" silently and fail at its first call (seen on the H100: two
            # bf16 -> fp32 linear problems of one specialization). core/plans.py retries on this error.
            limit = compiler.max_shared_mem(device.index or 0)
            if compiled.metadata.shared > limit:
                raise OutOfResources(compiled.metadata.shared, limit, "shared memory")
            compiled.run  # noqa: B018  loads the binary on this device (the property does)
        if getattr(compiled, "function", None) is None:  # not loaded after all: Triton's own path
            compiled = None
    return CompiledLaunch(jit_fn, grid, constexprs, options, compiled, device.index or 0)


_COMPILE_LOCK = threading.Lock()


def split_parameters(jit_fn) -> tuple[list[str], list[str]]:
    """A kernel's parameters as (runtime, constexpr) names, when every runtime one comes first;
    raises ValueError otherwise. Read from the Python signature, so it holds for interpreted
    kernels too."""
    names = list(inspect.signature(jit_fn.fn).parameters.values())
    is_constexpr = ["constexpr" in str(p.annotation) for p in names]
    first = is_constexpr.index(True) if True in is_constexpr else len(names)
    if not all(is_constexpr[first:]):
        raise ValueError(f"{jit_fn.fn.__name__}: a runtime parameter follows a constexpr one")
    return [p.name for p in names[:first]], [p.name for p in names[first:]]


def compiled_launches(launch, depth: int = 0) -> list[CompiledLaunch]:
    """The CompiledLaunch objects a plan's `launch` closes over, through the closures that wrap
    them (rung and descriptor binding): what tests and scripts/probes/host/host_breakdown.py inspect."""
    found = []
    for cell in getattr(launch, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, CompiledLaunch):
            found.append(value)
        elif callable(value) and depth < 3:
            found += compiled_launches(value, depth + 1)
    return found


def _hooked(hook) -> bool:
    """Whether a launch hook (a profiler's) is installed: then the launcher wants metadata."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _profiling() -> bool:
    """Whether a profiler has installed a launch hook: then Triton's launcher must run, for the
    metadata hooks read."""
    runtime = knobs.runtime
    return _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)
