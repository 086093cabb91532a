"""What the kernels ask of a CUDA device, asked once per device: its compute capability (which
kernels run there), its SM count (how many programs a persistent kernel launches) and its name
(which dispatch table applies). Both sit on
the launch path of every `matmul` call; torch answers them from the driver each time."""

import functools

import torch


def capability(device: torch.device) -> tuple[int, int]:
    return _properties(_index(device))[0]


def sm_count(device: torch.device) -> int:
    return _properties(_index(device))[1]


def name(device: torch.device) -> str:
    """The GPU model, as torch names it ("NVIDIA H100 80GB HBM3"): what dispatch tables are for."""
    return _properties(_index(device))[2]


def _index(device: torch.device) -> int:
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _properties(index: int) -> tuple[tuple[int, int], int, str]:
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count, props.name
