"""`QKVProjection`: attention's q, k and v projections of one input as one GEMM.

transformers' attention modules (Llama's and its kin: fuse.py says which) call `q_proj(h)`,
`k_proj(h)` and `v_proj(h)` one after the other on the same hidden states: three GEMMs that read
h three times and launch three kernels. At decode sizes each is a kernel that streams its weight,
and k's and v's (grouped-query attention: a quarter of q's width or less) are too narrow to keep
the SMs busy. One GEMM on the joined weight [q; k; v] does the same work in one launch.

The attention module's own forward runs unchanged. `QKVProjection` takes `q_proj`'s place and
holds the joined weight (and bias); `k_proj` and `v_proj` become `_SharedProjection`s that read
through it. Whichever of the three is called first with an input computes all three outputs with
one `tritongemm.linear` (each a view of the joined output) and keeps the other two; each of the
others takes its own when called with that same input: the same tensor object, unmodified since
(its version counter), in the same grad mode. A call with any other input gets a GEMM on its own
slice of the weight, so the module computes what it did, in one kernel where its forward calls the
projections as transformers' do. Under torch.compile each projection is its own GEMM on its slice:
the handing over is Python state, which a traced graph would not replay.

The kept outputs live until they are taken: in transformers' forward, a few lines later. The
handing over is not thread-safe: one module, one forward at a time, as in a model.

The state_dict keeps transformers' keys (`q_proj.weight`, `k_proj.weight`, `v_proj.weight`, and
the biases), as copies of the joined weight's rows; loading joins them again (`install` gives the
attention module the hook). Each projection
shows its rows as `weight` (a view), so code that reads `q_proj.weight.dtype` still works.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritongemm.dense import linear as fused

NAMES = ("q_proj", "k_proj", "v_proj")


@dataclass
class _Kept:
    """The outputs of the last joined GEMM not yet handed out, and the input they are of."""

    input: torch.Tensor
    version: int | None  # None for an inference tensor, which has no version counter
    grad: bool
    outputs: list  # by projection; None once taken


class QKVProjection(torch.nn.Module):
    """q_proj's place: the joined weight [q; k; v] (sum of out_features, in_features) and bias,
    and q's output; k_proj and v_proj read through it (`install` puts all three in place)."""

    def __init__(self, q: torch.nn.Linear, k: torch.nn.Linear, v: torch.nn.Linear, kernel: str = "auto") -> None:
        super().__init__()
        linears = (q, k, v)
        self.sizes = tuple(linear.out_features for linear in linears)
        self.in_features, self.out_features = q.in_features, q.out_features
        self.kernel = kernel
        trainable = any(linear.weight.requires_grad for linear in linears)
        joined = torch.cat([linear.weight.detach() for linear in linears])
        self.qkv_weight = torch.nn.Parameter(joined, requires_grad=trainable)
        if q.bias is not None:
            joined = torch.cat([linear.bias.detach() for linear in linears])
            self.qkv_bias = torch.nn.Parameter(joined, requires_grad=trainable)
        else:
            self.qkv_bias = None
        self._kept: _Kept | None = None
        self.train(q.training)
        self.register_state_dict_post_hook(_split_qkv)

    @classmethod
    def install(cls, attention: torch.nn.Module, kernel: str = "auto") -> QKVProjection:
        """Put one in `attention`'s q_proj place (its three linears' weights copied once into one)
        and its shared views in k_proj's and v_proj's; the attention module's load_state_dict
        then joins transformers' three keys (a child's hook sees only its own keys)."""
        joined = cls(attention.q_proj, attention.k_proj, attention.v_proj, kernel=kernel)
        attention.q_proj, attention.k_proj, attention.v_proj = (
            joined,
            _SharedProjection(joined, 1),
            _SharedProjection(joined, 2),
        )
        attention.register_load_state_dict_pre_hook(_join_qkv)
        return joined

    @property
    def weight(self) -> torch.Tensor:
        return self.rows(self.qkv_weight, 0)

    @property
    def bias(self) -> torch.Tensor | None:
        return None if self.qkv_bias is None else self.rows(self.qkv_bias, 0)

    def rows(self, joined: torch.Tensor, index: int) -> torch.Tensor:
        """Projection `index`'s rows of the joined weight or bias (a view)."""
        start = sum(self.sizes[:index])
        return joined[start : start + self.sizes[index]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(0, x)

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Projection `index` of x: a kept output of the joined GEMM on this very x if there is
        one, else from a new joined GEMM (keeping the other two), or under torch.compile a GEMM
        on its own rows."""
        bias = self.qkv_bias
        if torch.compiler.is_compiling():
            own_bias = None if bias is None else self.rows(bias, index)
            return fused.linear(x, self.rows(self.qkv_weight, index), own_bias, kernel=self.kernel)
        version = None if x.is_inference() else x._version
        kept = self._kept
        if (
            kept is not None
            and kept.input is x
            and kept.version == version
            and kept.grad == torch.is_grad_enabled()
            and kept.outputs[index] is not None
        ):
            out, kept.outputs[index] = kept.outputs[index], None
            if all(o is None for o in kept.outputs):
                self._kept = None
            return out
        outputs = list(fused.linear(x, self.qkv_weight, bias, kernel=self.kernel).split(self.sizes, dim=-1))
        out, outputs[index] = outputs[index], None
        self._kept = _Kept(x, version, torch.is_grad_enabled(), outputs)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, q/k/v out_features={self.sizes}, bias={self.qkv_bias is not None}"


class _SharedProjection(torch.nn.Module):
    """k_proj's or v_proj's place: its output from the QKVProjection in q_proj's place. The owner
    is not a submodule here (it is q_proj's), so the joined weight is registered once."""

    def __init__(self, owner: QKVProjection, index: int) -> None:
        super().__init__()
        self.__dict__["owner"] = owner  # not registered: no second path to the joined weight
        self.index = index
        self.in_features, self.out_features = owner.in_features, owner.sizes[index]

    @property
    def weight(self) -> torch.Tensor:
        return self.owner.rows(self.owner.qkv_weight, self.index)

    @property
    def bias(self) -> torch.Tensor | None:
        bias = self.owner.qkv_bias
        return None if bias is None else self.owner.rows(bias, self.index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.owner.output(self.index, x)

    def extra_repr(self) -> str:
        return f"{NAMES[self.index]} of q_proj's joined weight, out_features={self.out_features}"


def _sibling_prefix(prefix: str) -> str:
    """The attention module's prefix, from q_proj's own ("...self_attn.q_proj." -> "...self_attn.")."""
    assert prefix.endswith(NAMES[0] + "."), prefix
    return prefix[: -len(NAMES[0]) - 1]


def _split_qkv(module: QKVProjection, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict post-hook: transformers' three keys per tensor, as copies (savers read views of
    one storage as tied weights)."""
    parent = _sibling_prefix(prefix)
    for suffix in ("weight", "bias"):
        joined = state_dict.pop(f"{prefix}qkv_{suffix}", None)
        if joined is None:
            continue
        for index, name in enumerate(NAMES):
            state_dict[f"{parent}{name}.{suffix}"] = module.rows(joined.detach(), index).clone()


def _join_qkv(attention: torch.nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """The attention module's load_state_dict pre-hook: transformers' three keys joined into
    q_proj's one, before its children (k_proj and v_proj hold no parameters) see their keys."""
    for suffix in ("weight", "bias"):
        keys = [f"{prefix}{name}.{suffix}" for name in NAMES]
        if all(key in state_dict for key in keys):
            state_dict[f"{prefix}{NAMES[0]}.qkv_{suffix}"] = torch.cat([state_dict.pop(key) for key in keys])
