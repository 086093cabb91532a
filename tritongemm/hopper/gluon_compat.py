"""The Gluon calls whose names moved between the Triton releases tritongemm supports (3.6 to 3.9),
in one place, so that the kernels read the same on every release.

| what                    | triton 3.6, 3.7                   | 3.8                  | 3.9                  |
| TMA load                | tma.async_copy_global_to_shared   | both names           | tma.async_load       |
| TMA store               | tma.async_copy_shared_to_global   | both names           | tma.async_store      |
| view smem as other type | shared_memory_descriptor._reinterpret                   | .reinterpret         |

Each helper is chosen once, here, by what the installed Gluon has (not by version number, so a
release that keeps both spellings takes the newer one). The kernels call these names only.
"""

from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

# tma_load(desc, coord, barrier, dest_smem, pred): copy a block into shared memory, completing on barrier.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# tma_store(desc, coord, src_smem): copy a shared-memory block out to global memory.
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

# reinterpret(smem, dtype, shape, layout): smem's bytes as a buffer of another dtype, shape and
# layout (no data moves). The descriptor's builtin method, called unbound.
reinterpret = getattr(gl.shared_memory_descriptor, "reinterpret", None) or gl.shared_memory_descriptor._reinterpret
