"""The `hf` engine's fused projections (loop/generators/hf/fused.py) against their modules.

Each group (q/k/v, o, gate/up, down) must give what its modules give, LoRA included, after the
weights change (an optimiser step, then `refresh()`) and with the adapters disabled; a frozen
base weight must become a view of the fused rows (one copy of the weights), and a group with a
trainable one (full fine-tuning) is not fused (no second copy of the model).

Run: python -m pytest tests/loop/test_fused.py -q
"""

from __future__ import annotations

import sys

import pytest
import torch

from loop.generators.hf.engine import DecoderEngine
from loop.generators.hf.fused import Head, LayerProjections, can_pack
from loop.model.policy import LoraSettings, load_policy, policy_from_model
from tests.loop.conftest import tiny_llama, tiny_tokenizer
from tests.loop.test_kv_reuse import tiny_model


def lora_model(model_type: str, targets: str | tuple[str, ...] = "all-linear"):
    """A tiny model of `model_type` with LoRA whose B factors are not zero (so it counts)."""
    model = tiny_llama() if model_type == "llama" else tiny_model(model_type)
    lora = LoraSettings(rank=4, alpha=8, target_modules=targets)
    policy = policy_from_model(model, tiny_tokenizer(), torch.device("cpu"), lora=lora)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    return policy.model.eval()


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to float32 rounding, relative to the output's scale (the tiny models' random
    weights give outputs in the thousands)."""
    return bool((got - want).abs().max() <= 1e-5 * want.abs().max())


def assert_groups_equal_modules(layer, projections: LayerProjections) -> None:
    x = torch.randn(3, 5, layer.self_attn.q_proj.in_features)
    attn, mlp = layer.self_attn, layer.mlp
    with torch.no_grad():
        fused = [*projections.qkv(x), projections.o(x)[0], projections.mlp(x)]
        modules = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x), attn.o_proj(x), mlp(x)]
    for got, want in zip(fused, modules, strict=True):
        assert got.shape == want.shape
        assert close(got, want), (got - want).abs().max()


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize(
    ("model_type", "targets"),
    [("llama", "all-linear"), ("qwen2", "all-linear"), ("qwen2", ("q_proj", "v_proj", "up_proj"))],
)
def test_each_group_equals_its_modules_with_lora_biases_and_partial_targets(
    model_type, targets, packed
):
    model = lora_model(model_type, targets)
    for layer in model.base_model.model.model.layers:
        projections = LayerProjections(layer, packed=packed)
        assert_groups_equal_modules(layer, projections)
        assert (projections.qkv.packed is not None) == packed  # packed on first use


def test_frozen_base_weights_become_views_and_trainable_ones_are_not_fused() -> None:
    model = lora_model("llama")
    layer = model.base_model.model.model.layers[0]
    projections = LayerProjections(layer)
    rows = projections.qkv.weight
    assert rows is not None and rows.shape[0] == 64 + 32 + 32 + 3 * 4  # q, k, v, then 3 A's
    k_weight = layer.self_attn.k_proj.base_layer.weight
    assert k_weight.data_ptr() == rows[64].data_ptr()  # one copy: k's rows are its storage
    plain = tiny_llama().eval()
    plain_layer = plain.model.layers[0]
    plain_projections = LayerProjections(plain_layer)  # its weights train: called, not copied
    assert all(g.weight is None for g in (plain_projections.qkv, plain_projections.down))
    assert_groups_equal_modules(plain_layer, plain_projections)
    for parameter in plain.parameters():
        parameter.requires_grad_(False)
    frozen = LayerProjections(plain_layer)
    assert frozen.qkv.weight is not None
    assert plain_layer.self_attn.k_proj.weight.data_ptr() == frozen.qkv.weight[64].data_ptr()
    assert_groups_equal_modules(plain_layer, frozen)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_refresh_sees_an_optimizer_step_and_a_disabled_adapter_is_left_out(packed) -> None:
    model = lora_model("qwen2")
    layer = model.base_model.model.model.layers[1]
    projections = LayerProjections(layer, packed=packed)
    trained = [p for p in model.parameters() if p.requires_grad]
    for parameter in trained:
        parameter.grad = torch.ones_like(parameter)
    torch.optim.SGD(trained, lr=0.3).step()
    x = torch.randn(2, 1, 64)
    with torch.no_grad():
        stale = projections.qkv(x)[0]
        assert not close(stale, layer.self_attn.q_proj(x))  # before refresh
    projections.refresh()
    assert_groups_equal_modules(layer, projections)
    with model.disable_adapter(), torch.no_grad():
        base = layer.self_attn.q_proj.base_layer(x)
        assert close(projections.qkv(x)[0], base)
        assert close(projections.mlp(x), layer.mlp(x))


@pytest.mark.skipif(not can_pack(torch.ones(1)), reason="oneDNN's packed float32 products")
def test_a_dropped_plain_weight_comes_back_exactly_and_the_packed_copy_serves_meanwhile() -> None:
    """`drop`: the packed copy serves the products and the plain weight's pages go back (it
    reads zeros); `unpack`, `refresh`, a call of one of the group's modules, or a second
    engine's projections of the same weights bring its values back exactly."""
    model = lora_model("llama")
    layer = model.base_model.model.model.layers[0]
    projections = LayerProjections(layer, packed=True)
    group = projections.gate_up
    assert group.weight is not None
    kept, x = group.weight.clone(), torch.randn(2, 3, 64)
    with torch.no_grad():
        before = projections.mlp(x)
        projections.drop()
        assert group.dropped and not group.weight.any()  # its pages went back: zeros
        assert torch.equal(projections.mlp(x), before)  # the packed copy serves
        projections.unpack()
    assert not group.dropped and torch.equal(group.weight, kept)
    for restore in (
        lambda: projections.refresh(),
        lambda: layer.mlp.gate_proj(x),  # the learner's forward: a forward pre-hook
        lambda: LayerProjections(layer, packed=True),  # another engine's copy of the weights
    ):
        with torch.no_grad():
            projections.mlp(x)  # packed again
            projections.drop()
            restore()
        assert not group.dropped and torch.equal(group.weight, kept)
    assert_groups_equal_modules(layer, projections)


def test_groups_that_do_not_qualify_call_their_modules() -> None:
    model = tiny_llama().eval().requires_grad_(False)
    layer = model.model.layers[0]
    layer.mlp.down_proj = torch.nn.Sequential(layer.mlp.down_proj)  # not a plain linear
    projections = LayerProjections(layer)
    assert projections.down.weight is None and projections.gate_up.weight is not None
    assert_groups_equal_modules(layer, projections)


def test_the_packed_head_equals_the_module_and_follows_its_weight() -> None:
    model = tiny_llama().eval().requires_grad_(False)
    head = Head(model.lm_head, packed=True)
    x = torch.randn(3, 2, model.lm_head.in_features)
    with torch.no_grad():
        assert close(head(x), model.lm_head(x)) and head.packed is not None
        model.lm_head.weight.mul_(-0.5)  # changed in place: the packed copy is stale
        assert close(head(x), model.lm_head(x))
    head.unpack()
    assert head.packed is None
    with torch.no_grad():
        assert close(head(x[:, -1]), model.lm_head(x[:, -1]))  # a strided view packs too
    trained = Head(tiny_llama().lm_head, packed=True)  # a trainable head: the module is called
    with torch.no_grad():
        trained(x)
    assert trained.packed is None


def test_bfloat16_groups_pack_where_the_cpu_multiplies_bfloat16_natively() -> None:
    model = lora_model("llama").to(torch.bfloat16)
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert can_pack(torch.zeros(2, 2, dtype=torch.bfloat16)) == native
    assert not can_pack(torch.zeros(2, 2, dtype=torch.float16))
    layer = model.base_model.model.model.layers[0]
    plain, packed = LayerProjections(layer), LayerProjections(layer, packed=True)
    x = torch.randn(3, 5, layer.self_attn.q_proj.in_features, dtype=torch.bfloat16)
    with torch.no_grad():
        want, got = plain.mlp(plain.o(x)[0]), packed.mlp(packed.o(x)[0])
    assert (packed.o.packed is not None) == native
    assert got.dtype == torch.bfloat16
    # bfloat16 keeps 8 bits: the two products round in other orders
    assert (got.float() - want.float()).abs().max() <= 2e-2 * want.float().abs().max()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_engine_lets_the_model_files_mapping_go() -> None:
    """Loaded from its file, the model's tensors view a mapping of it; once the engine has
    fused the projections, no parameter views the file and that mapping's pages are no longer
    resident, and the model computes what it computed before."""
    policy = load_policy("smollm2-135m", lora=LoraSettings(rank=4, alpha=8))
    model = policy.model.eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        before = model(ids).logits
    spans = {span for span in file_spans() if viewed(model, span)}
    assert spans, "the model is expected to be loaded from a mapping of its file"
    assert sum(file_spans()[span] for span in spans) > 400 * 2**20  # its pages resident
    DecoderEngine(model, max_rows=1)
    assert not any(viewed(model, span) for span in file_spans())
    assert sum(file_spans().get(span, 0) for span in spans) == 0
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def file_spans() -> dict[tuple[int, int], int]:
    """This process's mappings of `.safetensors` files: (start, end) -> resident bytes."""
    spans: dict[tuple[int, int], int] = {}
    span = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if "-" in first and ":" not in first:  # a mapping's header line
                start, end = (int(x, 16) for x in first.split("-"))
                span = (start, end) if line.rstrip().endswith(".safetensors") else None
                if span is not None:
                    spans[span] = 0
            elif span is not None and first == "Rss:":
                spans[span] += int(line.split()[1]) * 1024
    return spans


def viewed(model: torch.nn.Module, span: tuple[int, int]) -> bool:
    """Whether any parameter's data lies inside `span`."""
    return any(span[0] <= parameter.data_ptr() < span[1] for parameter in model.parameters())
