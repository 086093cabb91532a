"""The Gluon calls whose names moved between the Triton releases tritongemm supports (3.6 to 3.9),
in one place, so that the kernels read the same on every release.

| what                    | triton 3.6, 3.7                   | 3.8                  | 3.9                  |
| TMA load                | tma.async_copy_global_to_shared   | both names           | tma.async_load       |
| TMA store               | tma.async_copy_shared_to_global   | both names           | tma.async_store      |
| view smem as other type | shared_memory_descriptor._reinterpret                   | .reinterpret         |
| TMEM tile to registers  | tmem.load(get_tmem_reg_layout(..))  | (not checked)        | tmem.load()          |
| barrier of the warps    | gl.thread_barrier; gl.barrier     | gl.barrier           | gl.barrier           |

Each helper is chosen once, here, by what the installed Gluon has (not by version number, so a
release that keeps both spellings takes the newer one). The kernels call these names only.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import blackwell
from triton.experimental.gluon.language.nvidia.hopper import tma

# tma_load(desc, coord, barrier, dest_smem, pred): copy a block into shared memory, completing on barrier.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# tma_store(desc, coord, src_smem): copy a shared-memory block out to global memory.
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

# thread_barrier(): every warp of the partition waits for the others (bar.sync).
thread_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

# reinterpret(smem, dtype, shape, layout): smem's bytes as a buffer of another dtype, shape and
# layout (no data moves). The descriptor's builtin method, called unbound.
reinterpret = getattr(gl.shared_memory_descriptor, "reinterpret", None) or gl.shared_memory_descriptor._reinterpret

# tmem_load(tmem): a tensor-memory tile into registers, in the layout of the TMEM load instruction
# (Blackwell, primitives/gluon/tcgen05.py). Triton 3.9 infers that layout itself and dropped the function
# that computed it.
if hasattr(blackwell, "get_tmem_reg_layout"):

    @gluon.jit
    def tmem_load(tmem):
        layout: gl.constexpr = blackwell.get_tmem_reg_layout(tmem.dtype, tmem.shape, tmem.layout, gl.num_warps())
        return tmem.load(layout)

else:

    @gluon.jit
    def tmem_load(tmem):
        return tmem.load()
