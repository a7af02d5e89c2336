"""The model shapes fsdp-eks knows, one row each, and the FLOPs per token of such a model: the
memory-fit check, the bench, the scaling report, the forecast and the fine-tune's MFU all read
them here. Import-light (no torch): the Pulumi program
imports it at preview.

Each row is the model's ``config.json`` on the Hugging Face hub (``hidden_size``,
``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``vocab_size``) and the parameter count its model card publishes. Adding a model is one row in
``SHAPES`` and its hub ids in ``HUB_IDS``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A decoder-only (Llama-style) model: SwiGLU MLP, grouped-query attention, untied head."""

    parameters: float
    """Parameter count (published)."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def kv_width(self) -> int:
        """Width of the key (and of the value) projection: kv heads x head dim."""
        return self.kv_heads * self.hidden // self.heads

    @property
    def layer_parameters(self) -> int:
        """Parameters of one decoder layer: q, o (h x h), k, v (h x h_kv), gate/up/down (h x i)."""
        return 2 * self.hidden**2 + 2 * self.hidden * self.kv_width + 3 * self.hidden * self.intermediate

    @property
    def counted_parameters(self) -> int:
        """Parameters counted from the shape: layers (with their two RMSNorm weights), the
        embedding and the untied output head, the final norm."""
        return self.layers * (self.layer_parameters + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    @property
    def largest_unit(self) -> int:
        """Parameters of the largest FSDP unit: a layer, or the root (embedding + output head)."""
        return max(self.layer_parameters, 2 * self.vocab * self.hidden)

    def llama_config(self) -> dict[str, int]:
        """The shape as ``transformers.LlamaConfig`` keyword arguments."""
        return {"hidden_size": self.hidden, "intermediate_size": self.intermediate,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "vocab_size": self.vocab}


def _llama2(parameters: float, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int) -> ModelShape:
    return ModelShape(parameters=parameters, layers=layers, hidden=hidden, intermediate=intermediate,
                      heads=heads, kv_heads=kv_heads, vocab=32000)


def _llama3(parameters: float, layers: int, hidden: int, intermediate: int, heads: int) -> ModelShape:
    return ModelShape(parameters=parameters, layers=layers, hidden=hidden, intermediate=intermediate,
                      heads=heads, kv_heads=8, vocab=128256)


SHAPES: dict[str, ModelShape] = {
    "llama2-7b": _llama2(6.74e9, 32, 4096, 11008, 32, 32),
    "llama2-13b": _llama2(13.0e9, 40, 5120, 13824, 40, 40),
    "llama2-70b": _llama2(69.0e9, 80, 8192, 28672, 64, 8),
    "llama3-8b": _llama3(8.03e9, 32, 4096, 14336, 32),
    "llama3-70b": _llama3(70.6e9, 80, 8192, 28672, 64),
}
"""Shapes by short name (the bench's ``--shape``)."""

HUB_IDS: dict[str, str] = {
    **{f"meta-llama/llama-2-{size}{chat}-hf": f"llama2-{size}"
       for size in ("7b", "13b", "70b") for chat in ("", "-chat")},
    **{f"meta-llama/{prefix}-{size}{suffix}": f"llama3-{size}"
       for size in ("8b", "70b")
       for prefix in ("meta-llama-3", "meta-llama-3.1", "llama-3.1")
       for suffix in ("", "-instruct")},
}
"""Lower-cased Hugging Face model id -> its row in ``SHAPES``."""


def flops_per_token(params_without_embedding: float, layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) of a decoder-only transformer: PaLM's
    6 x (parameters without the input-embedding table) + 12 x layers x hidden x sequence (the
    second term: attention's QK^T and AV matmuls; docs/design.md#measuring-speed). The fine-tune's
    MFU and the preview's forecast both use it."""
    return 6.0 * params_without_embedding + 12.0 * layers * hidden * seq_len


def shape_of_model(model: str) -> ModelShape | None:
    """The shape of a Hugging Face model id (any case); None if the table does not know it."""
    name = HUB_IDS.get(model.lower())
    return None if name is None else SHAPES[name]


TRAINED_CONTEXT: dict[str, int] = {
    hub_id: 4096 if "llama-2" in hub_id else 131072 if "3.1" in hub_id else 8192 for hub_id in HUB_IDS}
"""Lower-cased Hugging Face model id -> the positions it was trained at (its config.json's
``max_position_embeddings``): Llama 2 4,096; Llama 3 8,192; Llama 3.1 131,072 (with the
``rope_scaling`` its config.json carries)."""


def trained_context(model: str) -> int | None:
    """The context length a Hugging Face model id was trained at; None if the table does not know it."""
    return TRAINED_CONTEXT.get(model.lower())
