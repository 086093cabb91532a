"""`fuse_residuals`: a decoder layer's two residual adds done in the stores of the GEMMs before them,
what `tritongemm.patch(model, fuse=True)` runs last.

transformers' pre-norm decoder layers (Llama, Mistral, Qwen2/3, Gemma, and the MoE models built
like them) compute

    h = x + self_attn(input_layernorm(x))        # self_attn ends with o_proj
    y = h + mlp(post_attention_layernorm(h))     # a GatedMLP ends with down_proj

and each `+` is a kernel of its own that reads two (tokens, hidden) tensors and writes a third,
after the GEMM that just wrote one of them. `tritongemm.linear` adds a residual in its store, in
fp32 before the one rounding, so both adds can disappear into o_proj's and down_proj's epilogues.

The adds are in the layer's forward, which is transformers' code. Where a layer class's forward
is exactly the pattern above, statement for statement (checked on its syntax tree, `_attention_call`,
not on its name), the layer gets a forward built from that source (`_fused_forward_of`): the same
decorators, signature and attention call, and a body that hands the residual to o_proj and gives
it to the MLP. o_proj is inside the attention module's forward, which is not touched: the layer
leaves the residual with the handoff (`give`) just before calling attention, and o_proj, a
`ResidualLinear`, takes it on its call if it fits its output (shape, dtype, device; no autocast).
If it was not taken, for any reason, the layer adds it as before, so the layer computes what it
did whatever the attention module does; attention classes are still checked to return o_proj's
output as it is (`_returns_o_proj`), since a residual added inside it must reach the layer's sum
unchanged. The handoff is thread-local and always cleared when attention returns or raises.

Under torch.compile the layer runs its original forward (Inductor fuses the adds into the norms
that follow them).
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
import threading
import types

import torch

from tritongemm.blocks.gated_mlp import GatedMLP
from tritongemm.dense import linear as fused
from tritongemm.dense.module import Linear

# transformers' pre-norm decoder layer forward, the self_attn call's arguments aside.
PRE_NORM_FORWARD = (
    "residual = hidden_states",
    "hidden_states = self.input_layernorm(hidden_states)",
    "hidden_states, _ = self.self_attn(...)",
    "hidden_states = residual + hidden_states",
    "residual = hidden_states",
    "hidden_states = self.post_attention_layernorm(hidden_states)",
    "hidden_states = self.mlp(hidden_states)",
    "hidden_states = residual + hidden_states",
    "return hidden_states",
)

# Its replacement; ATTENTION_CALL becomes the original's self_attn call, as written there.
FUSED_BODY = """
residual = hidden_states
hidden_states = self.input_layernorm(hidden_states)
_tritongemm_residual.give(self.self_attn.o_proj, residual)
try:
    hidden_states, _ = ATTENTION_CALL
finally:
    untaken = _tritongemm_residual.take_back()
if untaken is not None:
    hidden_states = untaken + hidden_states
residual = hidden_states
hidden_states = self.post_attention_layernorm(hidden_states)
return _tritongemm_residual.mlp_plus(self.mlp, hidden_states, residual)
"""


class _Handoff(threading.local):
    pending: tuple[torch.nn.Module, torch.Tensor] | None = None


_HANDOFF = _Handoff()


def give(module: torch.nn.Module, residual: torch.Tensor) -> None:
    """Leave `residual` for `module`'s next call (a ResidualLinear) on this thread."""
    _HANDOFF.pending = (module, residual)


def take_back() -> torch.Tensor | None:
    """Clear the handoff; the residual if no module took it (the caller adds it), else None."""
    pending, _HANDOFF.pending = _HANDOFF.pending, None
    return None if pending is None else pending[1]


def _fits(residual: torch.Tensor, shape: tuple, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether adding `residual` in a store of that shape, dtype and device computes what the layer's
    own add computes: same shape (no broadcast), same dtype (an fp32 residual would make the sum
    fp32), and no autocast (which would change the GEMM's dtype)."""
    return (
        residual.shape == shape
        and residual.dtype == dtype
        and residual.device == device
        and not (fused._any_autocast() and torch.is_autocast_enabled(device.type))
    )


def mlp_plus(mlp: torch.nn.Module, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + mlp(hidden_states), the add in down_proj's store where the MLP is a GatedMLP."""
    if isinstance(mlp, GatedMLP) and _fits(
        residual, (*hidden_states.shape[:-1], mlp.hidden_size), hidden_states.dtype, hidden_states.device
    ):
        return mlp(hidden_states, residual=residual)
    return residual + mlp(hidden_states)


class ResidualLinear(Linear):
    """A tritongemm `Linear` that adds, in its store, a residual left for it by `give` (once: the
    call takes it). A call with nothing left for it, or with a residual that does not fit its output,
    is a plain Linear's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = None
        if not torch.compiler.is_compiling() and _HANDOFF.pending is not None:
            module, pending = _HANDOFF.pending
            if module is self and _fits(pending, (*x.shape[:-1], self.out_features), x.dtype, x.device):
                residual, _HANDOFF.pending = pending, None
        return fused.linear(x, self.weight, self.bias, activation=self.activation, residual=residual,
                            kernel=self.kernel)  # fmt: skip


def _shape(statement: ast.stmt) -> str:
    """A statement's source, a self_attn call's arguments written as `...`."""
    if isinstance(statement, ast.Assign) and _is_call_of(statement.value, "self_attn"):
        placeholder = ast.parse("self.self_attn(...)", mode="eval").body
        return ast.unparse(ast.Assign(targets=statement.targets, value=placeholder, lineno=0))
    return ast.unparse(statement)


def _is_call_of(node: ast.AST, attribute: str) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == f"self.{attribute}"


def _function_of(method) -> tuple[ast.FunctionDef, types.FunctionType] | str:
    """The syntax tree of `method`'s source and the undecorated function, or why not."""
    function = inspect.unwrap(method)
    if not isinstance(function, types.FunctionType):
        return f"its forward is {type(function).__name__}, not a Python function"
    if function.__code__.co_freevars:
        return "its forward is a closure"
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError) as error:
        return f"its forward's source is not readable ({error})"
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        return "its forward's source is not a def"
    return node, function


def _body(node: ast.FunctionDef) -> list[ast.stmt]:
    body = node.body
    docstring = body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return body[1:] if docstring else body


@functools.lru_cache(maxsize=64)  # one entry per layer class; thread-safe
def _fused_forward_of(layer_class: type):
    """The layer class's forward with its residual adds fused (a function of (self, ...)), or why
    its forward can't be: built from its own source, so its decorators, signature and attention
    call are the original's."""
    found = _function_of(layer_class.forward)
    if isinstance(found, str):
        return found
    node, function = found
    body = _body(node)
    if tuple(map(_shape, body)) != PRE_NORM_FORWARD:
        return "its forward is not the pre-norm pattern (h = x + self_attn(norm(x)); h + mlp(norm(h)))"
    attention_call = body[2].value

    class _PutCall(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.AST:
            return attention_call if name.id == "ATTENTION_CALL" else name

    node.body = [_PutCall().visit(statement) for statement in ast.parse(FUSED_BODY).body]
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    namespace = dict(function.__globals__, _tritongemm_residual=sys.modules[__name__])
    where = f"<tritongemm: {layer_class.__module__}.{layer_class.__qualname__}.forward, residuals fused>"
    exec(compile(module, where, "exec"), namespace)
    return namespace[node.name]


@functools.lru_cache(maxsize=64)
def _returns_o_proj(attention_class: type) -> str | None:
    """Why a residual added inside `attention_class`'s o_proj might not reach the layer's sum as it
    is (None: its forward calls o_proj once and returns that output first, untouched)."""
    found = _function_of(attention_class.forward)
    if isinstance(found, str):
        return found
    body = _body(found[0])
    calls = [n for n in ast.walk(found[0]) if _is_call_of(n, "o_proj")]
    last, returned = body[-2:] if len(body) >= 2 else (None, None)
    if (
        len(calls) == 1
        and isinstance(last, ast.Assign)
        and last.value is calls[0]
        and len(last.targets) == 1
        and isinstance(last.targets[0], ast.Name)
        and isinstance(returned, ast.Return)
        and isinstance(returned.value, ast.Tuple)
        and ast.unparse(returned.value.elts[0]) == last.targets[0].id
    ):
        return None
    return f"{attention_class.__name__}'s forward does not return o_proj's output as it is"


def fused_forward(self, *args, **kwargs):
    """A fused layer's forward (bound to the layer as `forward`): the residuals fused, or, under
    torch.compile, the class's own forward."""
    if torch.compiler.is_compiling():
        return type(self).forward(self, *args, **kwargs)
    return _fused_forward_of(type(self))(self, *args, **kwargs)


def _is_decoder_layer(module: torch.nn.Module) -> bool:
    names = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    return all(isinstance(getattr(module, name, None), torch.nn.Module) for name in names)


def why_not_residuals(layer: torch.nn.Module) -> str | None:
    """Why `layer`, a decoder layer by its children, keeps its residual adds (None: both or one of
    them can be in a store)."""
    if "forward" in layer.__dict__:
        return "its forward is replaced on the instance"
    fused_forward_or_why = _fused_forward_of(type(layer))
    if isinstance(fused_forward_or_why, str):
        return f"{type(layer).__name__}: {fused_forward_or_why}"
    o_proj_reason = _o_proj_takes(layer)
    if o_proj_reason is not None and not isinstance(layer.mlp, GatedMLP):
        return f"{o_proj_reason}, and its mlp is {type(layer.mlp).__name__}, not a GatedMLP"
    return None


def _o_proj_takes(layer: torch.nn.Module) -> str | None:
    """Why the layer's o_proj can't take the attention's residual (None: it can)."""
    o_proj = getattr(layer.self_attn, "o_proj", None)
    if type(o_proj) not in (Linear, ResidualLinear):
        return f"its o_proj is {type(o_proj).__name__}, not a tritongemm Linear"
    if o_proj.activation is not None or o_proj._forward_hooks or o_proj._forward_pre_hooks:
        return "its o_proj has an activation or hooks"
    return _returns_o_proj(type(layer.self_attn))


def fuse_residuals(model: torch.nn.Module) -> tuple[list[str], dict[str, str]]:
    """Give every decoder layer of `model` whose adds can be fused the fused forward, its o_proj as
    a `ResidualLinear` (sharing the Linear's parameters) where it can take the residual. Returns
    (the layers fused, {name: why not} for those left)."""
    fused_layers, left = [], {}
    for name, layer in list(model.named_modules()):
        if not name or not _is_decoder_layer(layer) or getattr(layer.forward, "__func__", None) is fused_forward:
            continue
        reason = why_not_residuals(layer)
        if reason is not None:
            left[name] = reason
            continue
        o_proj = layer.self_attn.o_proj
        if _o_proj_takes(layer) is None and type(o_proj) is Linear:
            layer.self_attn.o_proj = ResidualLinear.from_linear(o_proj, kernel=o_proj.kernel)
        layer.forward = types.MethodType(fused_forward, layer)
        fused_layers.append(name)
    return fused_layers, left
