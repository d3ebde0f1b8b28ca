"""Parameter counts and tensor sizes of the model, per pipeline stage and per TP rank.

Megatron conventions: column/row-parallel weights (and column biases) are split by t; layer
norms and row-parallel biases are replicated on every TP rank; the vocabulary is padded to a
multiple of 128*t; a GPT model adds learned positions on the first stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceforge.spec import Spec


def padded_vocab(spec: Spec) -> int:
    multiple = 128 * spec.tp
    return -(-spec.vocab // multiple) * multiple


@dataclass(frozen=True)
class LayerParams:
    """One transformer layer: dense parameters split across TP ranks (full count), replicated
    ones, and the experts one EP rank holds (full count before the TP split; 0 if dense)."""

    split: int
    replicated: int
    expert: int = 0

    def per_rank(self, tp: int) -> int:
        return self.split // tp + self.replicated


def is_moe_layer(spec: Spec, layer: int) -> bool:
    """Megatron's --moe-layer-freq pattern, after DeepSeek's first k dense layers."""
    return spec.experts > 0 and layer >= spec.moe_first_dense_layers and layer % spec.moe_layer_freq == 0


def mlp_params(spec: Spec, ffn_hidden: int | None = None) -> int:
    """One MLP (or one expert of inner size ffn_hidden): gpt fc1 W+b and fc2 W; llama gate, up, down."""
    h, f = spec.hidden, ffn_hidden or spec.ffn_hidden
    return h * f + f + f * h if spec.arch == "gpt" else 3 * h * f


def qkv_channels(spec: Spec) -> tuple[int, int, int]:
    """Channels of the full (all heads) query, key and value: GQA, or MLA's up-projected ones
    (keys carry a nope and a rope part, DeepSeek-V2 section 2.1)."""
    if spec.mla:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        return spec.heads * qk, spec.heads * qk, spec.heads * spec.v_head_dim
    return spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.kv_heads * spec.head_dim


def mla_latent_channels(spec: Spec) -> int:
    """MLA's compressed per-token latent: query latent (if compressed), KV latent and the shared
    rope key. With sequence parallelism this is what the TP group gathers (Megatron's
    multi_latent_attention.py gathers the compressed q and kv, not the hidden state)."""
    return spec.q_lora_rank + spec.kv_lora_rank + spec.qk_rope_head_dim


def attention_params(spec: Spec) -> tuple[int, int]:
    """(TP-split, TP-replicated) parameters of one attention block, its input norm included."""
    h = spec.hidden
    q, k, v = qkv_channels(spec)
    if spec.mla:
        # Megatron MLASelfAttention: the down projections (and their norms) are duplicated on
        # every TP rank; the up projections are column-parallel, the output row-parallel.
        ql, kl = spec.q_lora_rank, spec.kv_lora_rank
        q_params = ql * q if ql else h * q
        split = q_params + kl * (k - spec.heads * spec.qk_rope_head_dim + v) + v * h
        down = (h * ql + ql if ql else 0) + h * (kl + spec.qk_rope_head_dim) + kl
        return split, down + h
    if spec.arch == "gpt":
        # QKV W+b, proj W (split); proj b and one LayerNorm w+b (replicated).
        return h * (q + k + v) + (q + k + v) + q * h, h + 2 * h
    # Llama: Q, K, V, O without biases (split); the RMSNorm weight (replicated).
    return h * (q + k + v) + q * h, h


def layer_params(spec: Spec, layer: int = 0) -> LayerParams:
    h = spec.hidden
    attention, replicated = attention_params(spec)
    replicated += 3 * h if spec.arch == "gpt" else h  # MLP norm (and fc2 bias for gpt)
    if is_moe_layer(spec, layer):
        # The router (h x E) is replicated on every TP rank; each EP rank holds E/ep experts;
        # shared experts are an ordinary tensor-parallel MLP every token passes through.
        shared = spec.shared_experts * mlp_params(spec, spec.moe_ffn_hidden)
        routed = spec.experts // spec.ep * mlp_params(spec, spec.moe_ffn_hidden)
        return LayerParams(attention + shared, replicated + h * spec.experts, routed)
    return LayerParams(attention + mlp_params(spec), replicated)


def stage_layer_ranges(spec: Spec) -> list[range]:
    """Global layer indices per stage (non-interleaved): --layers-per-stage, or even with any
    shortfall taken from the outer stages first (last, first, second-last, ...), which hold the
    LM head and embedding (as Llama 3 405B did)."""
    p = spec.pp
    if spec.layers_per_stage:
        starts = [sum(spec.layers_per_stage[:i]) for i in range(p)]
        return [range(a, a + n) for a, n in zip(starts, spec.layers_per_stage)]
    base = -(-spec.layers // p)
    counts = [base] * p
    deficit = base * p - spec.layers
    order = [s for pair in zip(range(p - 1, -1, -1), range(p)) for s in pair]
    seen: list[int] = []
    for stage in order:
        if stage not in seen:
            seen.append(stage)
    for stage in seen[:deficit]:
        counts[stage] -= 1
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges


@dataclass(frozen=True)
class Chunk:
    """A contiguous run of layers one stage executes as a unit (a virtual stage when
    interleaved). The embedding sits on the model's first chunk, the LM head on its last."""

    stage: int
    index: int
    layers: range
    first: bool
    last: bool


def model_chunks(spec: Spec, stage: int) -> list[Chunk]:
    p, v = spec.pp, spec.virtual_stages
    last_stage = stage == p - 1
    if v == 1:
        return [Chunk(stage, 0, stage_layer_ranges(spec)[stage], stage == 0, last_stage)]
    per_chunk = spec.layers // (p * v)
    return [
        Chunk(stage, c, range((c * p + stage) * per_chunk, (c * p + stage + 1) * per_chunk),
              stage == 0 and c == 0, last_stage and c == v - 1)
        for c in range(v)
    ]


@dataclass(frozen=True)
class StageParams:
    """Parameters one TP rank of a stage holds, by unit (the unit ZeRO-3 gathers one at a time).
    Dense parameters are reduced over the DP group, expert ones over the expert-DP group."""

    layers: tuple[int, ...]
    dense: dict[int, int]  # layer -> dense parameters per TP rank
    expert: dict[int, int]  # layer -> expert parameters per TP rank (0 for dense layers)
    embedding: int  # word (+ position) embedding on the first stage, per TP rank
    head: int  # output layer (or tied copy) + final norm on the last stage, per TP rank
    # TP-replicated parameters whose gradients differ across TP ranks under sequence parallelism
    # (norms, row-parallel biases, routers): Megatron AllReduces them in the TP group at end of step.
    replicated: int

    @property
    def total(self) -> int:
        """Dense parameters of the stage on this rank (what the DP group reduces)."""
        return sum(self.dense.values()) + self.embedding + self.head

    @property
    def expert_total(self) -> int:
        return sum(self.expert.values())


def stage_params(spec: Spec, stage: int) -> StageParams:
    t, h = spec.tp, spec.hidden
    layers = tuple(layer for chunk in model_chunks(spec, stage) for layer in chunk.layers)
    params = {layer: layer_params(spec, layer) for layer in layers}
    first, last = stage == 0, stage == spec.pp - 1
    word = padded_vocab(spec) * h // t
    final_norm = 2 * h if spec.arch == "gpt" else h
    embedding = 0
    if first:
        positions = spec.seq_len * h if spec.arch == "gpt" else 0  # learned, replicated
        embedding = word + positions
    head = 0
    if last:
        # Untied: its own output layer. Tied with p > 1: a second copy of the word embedding.
        # Tied with p == 1: the first stage's copy serves, nothing more.
        output = 0 if (spec.tied_embeddings and spec.pp == 1) else word
        head = output + final_norm
    replicated = sum(lp.replicated for lp in params.values()) + (final_norm if last else 0)
    return StageParams(
        layers, {layer: lp.per_rank(t) for layer, lp in params.items()},
        {layer: lp.expert // t for layer, lp in params.items()}, embedding, head, replicated,
    )


def total_params(spec: Spec) -> int:
    """Psi: all parameters of the model (one copy of tied embeddings, unpadded vocabulary)."""
    h = spec.hidden
    n = 0
    for layer in range(spec.layers):
        lp = layer_params(spec, layer)
        n += lp.split + lp.replicated + lp.expert * spec.ep
    n += spec.vocab * h + (2 * h if spec.arch == "gpt" else h)  # word embedding, final norm
    if spec.arch == "gpt":
        n += spec.seq_len * h
    if not spec.tied_embeddings:
        n += spec.vocab * h
    return n


def active_params(spec: Spec) -> int:
    """Parameters one token passes through: total_params with only top_k routed experts per
    MoE layer (shared experts, router and embeddings included, as DeepSeek and Qwen count)."""
    unused = spec.experts - spec.top_k
    moe_layers = sum(1 for layer in range(spec.layers) if is_moe_layer(spec, layer))
    return total_params(spec) - moe_layers * unused * mlp_params(spec, spec.moe_ffn_hidden)


def local_tokens(spec: Spec) -> int:
    """Tokens of one micro-batch on one rank before any TP sharding: b*s/cp."""
    return spec.micro_batch * spec.seq_len // spec.cp


def activation_bytes(spec: Spec) -> int:
    """b*(s/cp)*h*e: one micro-batch's hidden states on a rank, the size of TP AllReduces and
    of full TP tensors."""
    return local_tokens(spec) * spec.hidden * spec.act_bytes


def p2p_bytes(spec: Spec) -> int:
    """Activation (or its gradient) crossing a stage boundary; sequence-sharded with SP."""
    full = activation_bytes(spec)
    return full // spec.tp if spec.sequence_parallel else full
