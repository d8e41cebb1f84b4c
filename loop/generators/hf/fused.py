"""Fused projections for the `hf` engine: one matrix product where the model has several.

A decode step of a few rows is hundreds of small matrix products (per layer 7 projections and
14 LoRA factors), each too small to keep a CPU core's vector units busy. The engine runs each
layer's projections in four groups that share an input (q/k/v, o, gate/up, down). A group's
weights are the rows of one tensor, `[W_1; ...; W_n; A_1; ...; A_n]` (the base weights, then
the LoRA A factors), so one product gives every base output and every LoRA hidden value; a
second, with the block-diagonal of the scaled B factors, adds the LoRA update: 2 products per
group, 8 per layer instead of 21.

One copy of the weights (packed copies for sampling on a CPU aside, below). A frozen base
weight (LoRA's base) becomes a view of its group's tensor (its parameter's `.data` is rebound
once), so the fused tensor is its only storage and the learner computes with the same
numbers; the extra memory is the A rows and the B block-diagonal (SmolLM2-135M, r=16: 28 MiB
in float32, most of it the block-diagonal's zeros).
A group with a trainable base weight (full fine-tuning) is not fused: its parameter must stay
the optimiser's own, and a fused copy would be a second copy of the model (15 GiB for a 7B
model in bfloat16); the modules are called instead. `refresh()` re-reads what may have changed
and is called whenever the weights' fingerprint changes (each optimiser step, `load_adapter`):
it copies the A and B factors and any base weight that is no longer a view (replaced)
into the tensors allocated the first time.

On a CPU in float32 the products run on a packed copy of each group's tensor (oneDNN's
blocked layout, `pack`), as vLLM's CPU backend runs its linears: a plain product re-packs the
weight on every call, which for a decode step's few rows costs about what the arithmetic does
(benchmarks/README.md, "Packed weights"). The packed copies are made on first use after each
`refresh()` and dropped by `unpack()` (the generator's `release_memory`, before the learner's
step): while sampling the frozen weights are held twice (SmolLM2-135M: +0.5 GiB).

A group whose modules are not plain `nn.Linear`s or peft LoRA `Linear`s over one, with one
active adapter and no DoRA, bias on B or merged weights (a 4-bit base, for one), is not fused:
`Projection.__call__` then calls the modules themselves. With peft's adapters disabled
(`disable_adapter()`), the LoRA update is left out, as peft leaves it out.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch import Tensor

from loop.generators.hf.pages import SlotMemory

# The row count oneDNN's packed layout is chosen for: a decode step's batch (any count runs).
PACK_ROWS = 24


def can_pack(weight: Tensor) -> bool:
    """Whether products with `weight` run packed here: a float32 tensor on a CPU with oneDNN,
    or a bfloat16 one where the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX: oneDNN's
    packed bfloat16 products then take about half the float32 time, reading half the bytes;
    elsewhere oneDNN would emulate them)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


def pack(weight: Tensor) -> Tensor:
    """`weight` (out, in) in oneDNN's blocked layout for `packed_linear` (a copy)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def packed_linear(x: Tensor, packed: Tensor) -> Tensor:
    """x (..., in) times the packed weight's transpose: `linear(x, weight)`, float rounding
    aside (the same products, another summation order)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


class Projection:
    """The modules of one group (sharing an input), fused when they qualify."""

    def __init__(self, modules: list[Any], *, packed: bool = False):
        self.modules = modules
        self.packs = packed  # products through a packed copy (see the module docstring)
        self.packed: Tensor | None = None
        self.sizes = [_base(m).out_features for m in modules] if _fusable(modules) else []
        self.lora = [m for m in modules if hasattr(m, "lora_A")]
        self.weight: Tensor | None = None  # (sum(sizes) + sum(ranks), in)
        self.memory: SlotMemory | None = None  # the weight's memory (its pages can go back)
        self.dropped = False  # the weight's pages given back, the packed copy its values
        self.lora_b: Tensor | None = None  # (sum(sizes), sum(ranks)), scaled
        self.bias: Tensor | None = None  # (sum(sizes),) or None
        self.refresh()

    def refresh(self) -> None:
        """Copy into the fused tensors what may have changed (see the module docstring)."""
        self.restore()
        self.packed = None  # packed again on first use
        if not self.sizes or any(m.merged for m in self.lora):
            self.weight = None  # merged weights already hold the LoRA update: use the modules
            return
        bases = [_base(m).weight for m in self.modules]
        n, ranks = sum(self.sizes), [_adapter(m)[0].weight.shape[0] for m in self.lora]
        if self.weight is None:
            shape = (n + sum(ranks), bases[0].shape[1])
            self.memory = SlotMemory(shape, bases[0].dtype, bases[0].device)
            self.weight = self.memory.tensor
            if self.memory.paged:  # a module called while the weight is dropped: restored
                restore = functools.partial(_restore, weakref.ref(self))
                for module in self.modules:
                    hook = _base(module).register_forward_pre_hook(restore)
                    weakref.finalize(self, hook.remove)
            self.lora_b = bases[0].new_zeros((n, sum(ranks))) if self.lora else None
        start, rank_start = 0, n
        for module, weight in zip(self.modules, bases, strict=True):
            if (owner := _DROPPED.get(weight.untyped_storage().data_ptr())) is not None:
                owner.restore()  # the weight of another engine's group, dropped: its values
            rows = self.weight[start : start + weight.shape[0]]
            if weight.data_ptr() != rows.data_ptr():
                rows.copy_(weight.detach())
                if not weight.requires_grad:  # frozen: its one copy is now the fused rows
                    weight.data = rows
            if module in self.lora:
                a, b, scaling = _adapter(module)
                self.weight[rank_start : rank_start + a.weight.shape[0]] = a.weight.detach()
                assert self.lora_b is not None
                block = self.lora_b[start : start + weight.shape[0], rank_start - n :]
                block[:, : a.weight.shape[0]] = b.weight.detach() * scaling
                rank_start += a.weight.shape[0]
            start += weight.shape[0]
        biases = [_base(m).bias for m in self.modules]
        if all(b is None for b in biases):
            self.bias = None
        else:
            zeros = [torch.zeros_like(w[:, 0]) for w in bases]
            parts = [z if b is None else b.detach() for b, z in zip(biases, zeros, strict=True)]
            self.bias = torch.cat(parts)

    def __call__(self, x: Tensor) -> list[Tensor]:
        """x: (..., in) -> each module's output (..., out_i), in the group's order."""
        if self.weight is None:
            return [module(x) for module in self.modules]
        n = sum(self.sizes)
        if self.packs and self.packed is None and can_pack(self.weight):
            self.packed = pack(self.weight)
        if self.packed is not None:
            hidden = packed_linear(x, self.packed)  # (..., n + R)
        else:
            hidden = torch.nn.functional.linear(x, self.weight)
        out = hidden[..., :n]
        if self.lora_b is not None and not self.lora[0].disable_adapters:
            flat = torch.addmm(
                out.reshape(-1, n),
                hidden[..., n:].reshape(-1, hidden.shape[-1] - n),
                self.lora_b.t(),
            )
            out = flat.view(*x.shape[:-1], n)
        if self.bias is not None:
            out = out + self.bias
        return list(out.split(self.sizes, dim=-1))

    def drop(self) -> None:
        """Pack now, and give the plain weight's pages back while the packed copy serves the
        products (sampling): one copy of the frozen weights in memory, not two. The plain
        weight reads zeros until `restore`, which `refresh`, `unpack` and a call of any of the
        group's modules (the learner's forward) run first."""
        if self.weight is None or self.memory is None or not self.memory.paged:
            return
        if not (self.packs and can_pack(self.weight)):
            return
        if self.packed is None:
            self.packed = pack(self.weight)
        self.memory.give_back(self.weight)
        self.dropped = True
        _DROPPED[self.weight.untyped_storage().data_ptr()] = self

    def restore(self) -> None:
        """The plain weight's values back from the packed copy (exactly: a change of layout)."""
        if not self.dropped:
            return
        assert self.weight is not None and self.packed is not None
        self.weight.copy_(self.packed.to_dense())
        self.dropped = False
        _DROPPED.pop(self.weight.untyped_storage().data_ptr(), None)

    def unpack(self) -> None:
        """Drop the packed copy (made again on first use), the plain weight restored first."""
        self.restore()
        self.packed = None


class LayerProjections:
    """One decoder layer's four groups: q/k/v, o, gate/up, down."""

    def __init__(self, layer: Any, *, packed: bool = False):
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = Projection([attn.q_proj, attn.k_proj, attn.v_proj], packed=packed)
        self.o = Projection([attn.o_proj], packed=packed)
        self.gate_up = Projection([mlp.gate_proj, mlp.up_proj], packed=packed)
        self.down = Projection([mlp.down_proj], packed=packed)
        self.act_fn = mlp.act_fn

    @property
    def groups(self) -> tuple[Projection, ...]:
        return (self.qkv, self.o, self.gate_up, self.down)

    def refresh(self) -> None:
        for group in self.groups:
            group.refresh()

    def unpack(self) -> None:
        for group in self.groups:
            group.unpack()

    def drop(self) -> None:
        for group in self.groups:
            group.drop()

    def mlp(self, x: Tensor) -> Tensor:
        """The gated MLP: down(act(gate(x)) * up(x))."""
        gate, up = self.gate_up(x)
        return self.down(self.act_fn(gate) * up)[0]


def own_storage(model: Any, layers: list[LayerProjections]) -> int:
    """Give every frozen parameter that no fused tensor holds a copy of its own; returns how
    many were copied.

    transformers maps a model file into memory on a CPU and its tensors view the mapping; the
    pages a forward pass reads stay resident while any tensor views the file. Once the base
    projections are views of the fused tensors, only the embeddings and the norms still view
    it, and they keep the whole file resident: SmolLM2-135M's 514 MiB, 400 of them the
    projections' pages, which nothing reads any more. Copied (the tied embedding's 108 MiB),
    the mapping goes. On a GPU the weights were copied at load: nothing to do.
    """
    fused = {
        group.weight.untyped_storage().data_ptr()
        for layer in layers
        for group in layer.groups
        if group.weight is not None
    }
    copied = 0
    for parameter in model.parameters():
        storage = parameter.untyped_storage().data_ptr()
        if parameter.device.type != "cpu" or parameter.requires_grad or storage in fused:
            continue
        parameter.data = parameter.data.clone()
        copied += 1
    return copied


class Head:
    """The LM head, through a packed copy of its weight when that is a plain frozen linear
    (the tied embedding, a quarter of a small model's decode products)."""

    def __init__(self, module: Any, *, packed: bool = False):
        self.module = module
        self.packs = (
            packed
            and type(module) is torch.nn.Linear
            and module.bias is None
            and not module.weight.requires_grad
        )
        self.packed: Tensor | None = None
        self.source: tuple[int, int] | None = None  # the weight packed: storage, version

    def __call__(self, x: Tensor) -> Tensor:
        weight = self.module.weight
        if not self.packs or not can_pack(weight):
            return self.module(x)
        source = (weight.data_ptr(), weight._version)
        if self.packed is None or source != self.source:
            self.packed, self.source = pack(weight), source
        return packed_linear(x, self.packed)

    def unpack(self) -> None:
        self.packed = None


# The groups whose plain weight is dropped, by the weight's storage address (see `drop`).
_DROPPED: weakref.WeakValueDictionary[int, Projection] = weakref.WeakValueDictionary()


def _restore(group: weakref.ref[Projection], *_: Any) -> None:
    """A forward pre-hook of a group's modules: the group's plain weight back first."""
    if (alive := group()) is not None:
        alive.restore()


def _base(module: Any) -> Any:
    return getattr(module, "base_layer", module)


def _adapter(module: Any) -> tuple[Any, Any, float]:
    """The active adapter's A, B and scaling of a peft LoRA `Linear`."""
    name = module.active_adapters[0]
    return module.lora_A[name], module.lora_B[name], module.scaling[name]


def _fusable(modules: list[Any]) -> bool:
    """Plain frozen linears, or peft LoRA linears over one with one plain active adapter."""
    for module in modules:
        if type(_base(module)) is not torch.nn.Linear or _base(module).weight.requires_grad:
            return False
        if hasattr(module, "lora_A"):
            if len(module.active_adapters) != 1 or any(module.use_dora.values()):
                return False
            if _adapter(module)[1].bias is not None:
                return False
        elif module is not _base(module):
            return False
    return True
