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
    return spec.experts > 0 and layer % spec.moe_layer_freq == 0


def mlp_params(spec: Spec) -> int:
    """One MLP (or one expert): gpt fc1 W+b and fc2 W; llama gate, up, down."""
    h, f = spec.hidden, spec.ffn_hidden
    return h * f + f + f * h if spec.arch == "gpt" else 3 * h * f


def layer_params(spec: Spec, layer: int = 0) -> LayerParams:
    h = spec.hidden
    kv_dim = spec.kv_heads * (h // spec.heads)
    qkv_out = h + 2 * kv_dim
    if spec.arch == "gpt":
        # QKV W+b, proj W (split); proj b, fc2 b, two LayerNorms w+b (replicated).
        attention, replicated = h * qkv_out + qkv_out + h * h, h + h + 4 * h
    else:
        # Llama: Q, K, V, O without biases (split); two RMSNorm weights (replicated).
        attention, replicated = h * qkv_out + h * h, 2 * h
    if is_moe_layer(spec, layer):
        # The router (h x E) is replicated on every TP rank; each EP rank holds E/ep experts.
        return LayerParams(attention, replicated + h * spec.experts, spec.experts // spec.ep * mlp_params(spec))
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


@dataclass(frozen=True)
class Param:
    """One parameter tensor as one TP rank (and, for experts, one EP rank) holds it."""

    name: str
    elements: int
    expert: bool = False  # reduced over the expert-DP group
    shared_embedding: bool = False  # the tied word embedding on the first or last stage


def layer_param_list(spec: Spec, layer: int) -> list[Param]:
    """A layer's parameters per TP rank in the order Megatron registers them (the TE layer spec:
    each LayerNorm fused into the linear after it; an MoE layer's pre-MLP norm on its own):
    linear_proj, linear_qkv (norm first), then the MLP's linear_fc1 (norm first) and linear_fc2,
    or the norm, router and the local experts' fc1 and fc2. (Megatron-LM core/transformer/
    {transformer_layer,attention,mlp}.py; TransformerEngine registers a LayerNormLinear's norm
    weight and bias before its weight and bias.) Sums to layer_params(...).per_rank(t)."""
    h, t, f, gpt = spec.hidden, spec.tp, spec.ffn_hidden, spec.arch == "gpt"
    kv_dim = spec.kv_heads * (h // spec.heads)
    qkv_out = h + 2 * kv_dim
    norm = [Param("norm_weight", h)] + ([Param("norm_bias", h)] if gpt else [])
    out = [Param("proj_weight", h * h // t)] + ([Param("proj_bias", h)] if gpt else [])
    out += norm + [Param("qkv_weight", h * qkv_out // t)] + ([Param("qkv_bias", qkv_out // t)] if gpt else [])
    fc1 = h * f // t if gpt else 2 * h * f // t  # Llama's gate and up projections in one weight
    if is_moe_layer(spec, layer):
        out += norm + [Param("router_weight", spec.experts * h)]
        for e in range(spec.experts // spec.ep):
            out += [Param(f"expert{e}_fc1_weight", fc1, expert=True)]
            out += [Param(f"expert{e}_fc1_bias", f // t, expert=True)] if gpt else []
        out += [Param(f"expert{e}_fc2_weight", f * h // t, expert=True) for e in range(spec.experts // spec.ep)]
        return out + ([Param("fc2_bias", h)] if gpt else [])  # one replicated output bias, as layer_params counts
    out += norm + [Param("fc1_weight", fc1)] + ([Param("fc1_bias", f // t)] if gpt else [])
    return out + [Param("fc2_weight", f * h // t)] + ([Param("fc2_bias", h)] if gpt else [])


def chunk_param_list(spec: Spec, chunk: Chunk) -> list[tuple[str, Param]]:
    """(unit, parameter) of one model chunk per TP rank, in registration order: the embedding
    (word, then learned positions), the layers, the final norm, the output layer (Megatron-LM
    core/models/gpt/gpt_model.py). Units are what ZeRO-3 gathers: embed, L<i>, head."""
    h, shared = spec.hidden, spec.tied_embeddings and spec.pp > 1
    word = padded_vocab(spec) * h // spec.tp
    out: list[tuple[str, Param]] = []
    if chunk.first:
        out.append(("embed", Param("word_embeddings", word, shared_embedding=shared)))
        if spec.arch == "gpt":
            out.append(("embed", Param("position_embeddings", spec.seq_len * h)))
    for layer in chunk.layers:
        out += [(f"L{layer}", p) for p in layer_param_list(spec, layer)]
    if chunk.last:
        out.append(("head", Param("final_norm_weight", h)))
        if spec.arch == "gpt":
            out.append(("head", Param("final_norm_bias", h)))
        if not (spec.tied_embeddings and spec.pp == 1):  # tied with p == 1: the embedding serves
            out.append(("head", Param("output_layer", word, shared_embedding=shared)))
    return out
