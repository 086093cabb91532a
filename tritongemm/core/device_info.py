"""What the kernels ask of a CUDA device, asked once per device: its compute capability (which
kernels run there), its SM count (how many programs a persistent kernel launches), its name
(which dispatch table applies) and its L2 cache's size. The first two sit on the launch path of
every `matmul` call; torch answers them from the driver each time.

`sparing_sms(n)` lowers the SM count the kernels see, inside a `with`, for GEMMs that run beside
kernels of another stream (the tensor-parallel ops' barriers, distributed/exchange.py): a
persistent GEMM launches a program per SM and holds each SM whole, so a kernel queued beside it
would start only when it ends. The plan cache's key holds the count (core/plans.py)."""

import contextlib
import contextvars
import functools

import torch

# The interpreter has no SMs: 4 'virtual SMs' keep several tiles per persistent program in the
# small CPU test shapes.
INTERPRETER_SMS = 4


def capability(device: torch.device) -> tuple[int, int]:
    return _properties(_index(device))[0]


def sm_count(device: torch.device) -> int:
    """The SMs the kernels may fill: the device's, less those `sparing_sms` leaves free."""
    return _properties(_index(device))[1] - _SPARE_SMS.get()


# A context variable, not a global: the count applies to the thread (and task) that set it only.
_SPARE_SMS: contextvars.ContextVar[int] = contextvars.ContextVar("tritongemm_spare_sms", default=0)


def spare_sms() -> int:
    """The SMs left free in this context (0 outside `sparing_sms`)."""
    return _SPARE_SMS.get()


@contextlib.contextmanager
def sparing_sms(count: int):
    """Inside: kernels planned here launch on all SMs but `count`, which stay free for kernels of
    other streams."""
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"sparing_sms: expected count to be an int >= 0, but got {count!r}")
    token = _SPARE_SMS.set(count)
    try:
        yield
    finally:
        _SPARE_SMS.reset(token)


def l2_bytes(device: torch.device) -> int:
    """The device's L2 cache, in bytes."""
    return _properties(_index(device))[3]


def name(device: torch.device) -> str:
    """The GPU model, as torch names it ("NVIDIA H100 80GB HBM3"): what dispatch tables are for."""
    return _properties(_index(device))[2]


def _index(device: torch.device) -> int:
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _properties(index: int) -> tuple[tuple[int, int], int, str, int]:
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count, props.name, props.L2_cache_size


@functools.cache
def interpreter_active() -> bool:
    """True when the `triton.language` kernels are decorated for Triton's CPU interpreter.

    Triton reads TRITON_INTERPRET when `@triton.jit` runs, that is when a kernel module is
    imported (on a plan's first build), so setting it later has no effect: a decorated probe
    answers, once, instead of the environment."""
    import triton  # deferred: decorating fixes the interpreter switch, which import tritongemm must not
    from triton.runtime.interpreter import InterpretedFunction

    @triton.jit
    def probe():
        pass

    return isinstance(probe, InterpretedFunction)


@contextlib.contextmanager
def modelled_gpu(name: str, capability: tuple[int, int], sms: int, l2_bytes: int):
    """Inside: every CUDA device answers as this GPU (`capability`, `sm_count`, `name`,
    `l2_bytes`), and no driver is asked, so the dispatch's rules and tables can be asked about a
    GPU on any machine: `tritongemm explain-choice --gpu`, and the tools' models of a GPU. For
    tools only: the answers are the process's, not the thread's, while it lasts, so run no kernel
    meanwhile."""
    if not (isinstance(sms, int) and sms > 0 and isinstance(l2_bytes, int) and l2_bytes > 0):
        raise ValueError(f"modelled_gpu: expected sms and l2_bytes to be ints > 0, but got {sms!r} and {l2_bytes!r}")
    global _index, _properties
    saved = _index, _properties
    _index = lambda device: 0  # not torch.cuda.current_device(): no driver to ask
    _properties = lambda index: (tuple(capability), sms, name, l2_bytes)
    try:
        yield
    finally:
        _index, _properties = saved
