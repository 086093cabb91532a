"""Column- and row-parallel linear layers, and `parallelize`, which shards a model's MLP and
attention projections with them (Megatron-LM's tensor parallelism).

An MLP's up projection splits by output features (column-parallel: each rank holds rows of the
(N, K) weight and computes its columns of y), its down projection by input features
(row-parallel: each rank holds columns of the weight, multiplies its slice of the hidden
activations, and the ranks' partial outputs are summed). Between the two nothing is exchanged.
Attention splits the same way, by heads.

Two ways to carry the activations between layers, `sequence_parallel`:
- False (default): every rank holds the whole (..., hidden) activation. The column layer needs no
  communication; the row layer all-reduces its output.
- True: each rank holds its slice of the tokens (along `sequence_dim`). The column layer is an
  `all_gather_matmul` and the row layer a `matmul_reduce_scatter`, each with its communication
  hidden under the GEMMs, and the norms and residual adds between them run on a slice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tritongemm.dense.linear import linear
from tritongemm.distributed.overlapped import all_gather_matmul, matmul_reduce_scatter


class _ParallelLinear(torch.nn.Module):
    """What the two layers share: this rank's shard of an (out_features, in_features) weight, split
    along `SPLIT` ("out" rows or "in" columns), how it is cut from a whole `nn.Linear`, and the
    options. The bias is split with the output features, or whole where they are."""

    SPLIT = "out"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, group=None,
                 sequence_parallel: bool = False, sequence_dim: int = 0, device=None, dtype=None):  # fmt: skip
        super().__init__()
        self.group = group or dist.group.WORLD
        world = dist.get_world_size(self.group)
        split = out_features if self.SPLIT == "out" else in_features
        if split % world:
            raise ValueError(
                f"{type(self).__name__}: expected {self.SPLIT}_features divisible by the group's size {world}, "
                f"but got {split}"
            )
        self.in_features, self.out_features = in_features, out_features
        self.sequence_parallel, self.sequence_dim = sequence_parallel, sequence_dim
        rows, cols = (
            (out_features // world, in_features) if self.SPLIT == "out" else (out_features, in_features // world)
        )
        self.weight = torch.nn.Parameter(torch.empty((rows, cols), device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(rows, device=device, dtype=dtype)) if bias else None

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, group=None, *, sequence_parallel=False, sequence_dim=0):
        """This rank's share of a whole `nn.Linear` that every rank holds alike."""
        new = cls(layer.in_features, layer.out_features, layer.bias is not None, group=group,
                  sequence_parallel=sequence_parallel, sequence_dim=sequence_dim,
                  device=layer.weight.device, dtype=layer.weight.dtype)  # fmt: skip
        with torch.no_grad():
            if cls.SPLIT == "out":
                rows = _share(layer.out_features, new.group)
                new.weight.copy_(layer.weight[rows])
                if layer.bias is not None:
                    new.bias.copy_(layer.bias[rows])
            else:
                new.weight.copy_(layer.weight[:, _share(layer.in_features, new.group)])
                if layer.bias is not None:
                    new.bias.copy_(layer.bias)
        return new

    def extra_repr(self) -> str:
        shards = f" ({dist.get_world_size(self.group)} shards)"
        return (f"in_features={self.in_features}{shards if self.SPLIT == 'in' else ''}, "
                f"out_features={self.out_features}{shards if self.SPLIT == 'out' else ''}, "
                f"bias={self.bias is not None}, sequence_parallel={self.sequence_parallel}")  # fmt: skip


class ColumnParallelLinear(_ParallelLinear):
    """y[..., this rank's features] = x @ weight.T + bias, for this rank's out_features / world rows
    of the weight. Input: the whole activation, or with `sequence_parallel` this rank's tokens
    (gathered along `sequence_dim` under the GEMM). Output: this rank's features, all tokens."""

    SPLIT = "out"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            return all_gather_matmul(x, self.weight.T, self.group, gather_dim=self.sequence_dim, bias=self.bias)
        return linear(_CopyToParallel.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(_ParallelLinear):
    """y = sum over ranks of x[..., rank's features] @ weight[:, rank's features].T, + bias. Input:
    this rank's in_features / world features (a column-parallel layer's output). Output: the whole
    activation (all-reduced), or with `sequence_parallel` this rank's tokens (reduce-scattered
    along `sequence_dim` under the GEMM, the bias added in the same pass)."""

    SPLIT = "in"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            # Each rank adds the bias to its own tokens only: its gradient sums over the group.
            bias = None if self.bias is None else _CopyToParallel.apply(self.bias, self.group)
            return matmul_reduce_scatter(x, self.weight.T, self.group, scatter_dim=self.sequence_dim, bias=bias)
        y = _AllReduce.apply(linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


# A transformers block's projections by attribute name: (column-parallel ones, the row-parallel one).
_BLOCKS = {"attention": (("q_proj", "k_proj", "v_proj"), "o_proj"), "mlp": (("gate_proj", "up_proj"), "down_proj")}


def parallelize(model: torch.nn.Module, group=None) -> list[str]:
    """Shard a transformers model's attention and gated-MLP projections over `group` in place:
    q, k, v, gate and up column-parallel, o and down row-parallel (the whole activation on every
    rank, an all-reduce after each block). Every rank must hold the same model. Returns the names
    of the blocks it sharded. Attention is split by heads, so the query and key/value head counts
    must divide by the group's size; a block that doesn't, or whose projections are not plain
    `nn.Linear`s, stays whole. Call `tritongemm.patch` afterwards to serve the rest (lm_head)."""
    group = group or dist.group.WORLD
    world = dist.get_world_size(group)
    sharded = []
    for name, module in list(model.named_modules()):
        for columns, row in _BLOCKS.values():
            layers = [getattr(module, n, None) for n in (*columns, row)]
            if not all(isinstance(layer, torch.nn.Linear) for layer in layers):  # tritongemm.nn.Linear too
                continue
            head_dim = getattr(module, "head_dim", 1)
            if any(layer.out_features % (head_dim * world) for layer in layers[:-1]):
                continue
            for n in columns:
                setattr(module, n, ColumnParallelLinear.from_linear(getattr(module, n), group))
            setattr(module, row, RowParallelLinear.from_linear(getattr(module, row), group))
            sharded.append(name)
    return sharded


def _share(features: int, group) -> slice:
    per = features // dist.get_world_size(group)
    rank = dist.get_rank(group)
    return slice(rank * per, (rank + 1) * per)


class _CopyToParallel(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over the group: a tensor every rank holds
    whole (an activation, a replicated bias) feeds a different shard's computation on each."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _AllReduce(torch.autograd.Function):
    """Sum over the group; the backward is the identity: each rank's partial output reaches the
    (same) loss through the sum with weight one."""

    @staticmethod
    def forward(ctx, partial, group):
        partial = partial.contiguous()
        dist.all_reduce(partial, group=group)
        return partial

    @staticmethod
    def backward(ctx, grad):
        return grad, None
