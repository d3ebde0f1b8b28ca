"""The sizes every part of the anatomy is cut to: tokens on a rank, channels of attention's
tensors, the padded vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.config import Layer, LayerRun, ModelConfig


def local_tokens(spec: LayerRun) -> int:
    """Tokens of one micro-batch on one rank before any TP sharding: b*s/cp (tokens_of, asked
    per op by the programs)."""
    return spec.micro_batch * spec.seq_len // spec.cp


def tokens_of(spec: Layer, micro_batch: int) -> int:
    """local_tokens of a micro-batch of this many sequences."""
    return micro_batch * spec.seq_len // spec.cp


def dispatched_copies(spec: LayerRun) -> int:
    """Token copies one rank dispatches per micro-batch (balanced routing: receives), top_k of
    each token it routes: MoE with TP runs with SP, so a rank routes its sequence shard, b*s/cp/t
    tokens (the generator's routing, and the memory model's imbalance, draw this many)."""
    return local_tokens(spec) // spec.tp * spec.top_k


def padded_vocab(spec: Layer) -> int:
    """The vocabulary padded to a multiple of 128*t (Megatron's make_vocab_size_divisible_by)."""
    multiple = 128 * spec.tp
    return -(-spec.vocab // multiple) * multiple


def is_moe_layer(spec: ModelConfig, layer: int) -> bool:
    """Megatron's --moe-layer-freq pattern, after DeepSeek's first k dense layers."""
    return spec.experts > 0 and layer >= spec.moe_first_dense_layers and layer % spec.moe_layer_freq == 0


def moe_layers(spec: ModelConfig) -> int:
    """How many of the model's layers are MoE layers (is_moe_layer)."""
    return sum(1 for layer in range(spec.layers) if is_moe_layer(spec, layer))


def qkv_channels(spec: ModelConfig) -> tuple[int, int, int]:
    """Channels of the full (all heads) query, key and value: GQA, or MLA's up-projected ones
    (keys carry a nope and a rope part, DeepSeek-V2 section 2.1)."""
    if spec.mla:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        return spec.heads * qk, spec.heads * qk, spec.heads * spec.v_head_dim
    return spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.kv_heads * spec.head_dim


def attention_output_channels(spec: ModelConfig) -> int:
    """Channels of attention's output, into the output projection: every query head's values
    (under GQA the value channels of qkv_channels count only the shared KV heads')."""
    return spec.heads * (spec.v_head_dim if spec.mla else spec.head_dim)


@dataclass(frozen=True)
class Sizes:
    """One micro-batch on one GPU: T = b*s/cp tokens; the residual stream's `seq` tokens (T/t
    under sequence parallelism, which shards it over the TP group, `rep` = t, else 1); t the TP
    size, h the hidden size, e bytes per activation element, gpt/gated the MLP's kind."""

    T: int
    seq: int
    rep: int
    t: int
    h: int
    e: int
    gpt: bool

    @classmethod
    def of(cls, spec: Layer, tokens: int = 0) -> Sizes:
        """tokens: local_tokens of the micro-batch; 0 for the weights alone, which read no batch
        (a layer's and a stage's parameters are memoised without one)."""
        T, t = tokens, spec.tp
        rep = t if spec.sequence_parallel else 1
        return cls(T, T // t if spec.sequence_parallel else T, rep, t, spec.hidden, spec.act_bytes, spec.arch == "gpt")

    @property
    def gated(self) -> int:
        """fc1's outputs per MLP channel: SwiGLU's gate and up (llama), or one (gpt's GeLU)."""
        return 1 if self.gpt else 2
