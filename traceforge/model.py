"""Parameter counts and tensor sizes of the model, per pipeline stage and per TP rank.

Megatron conventions: column/row-parallel weights (and column biases) are split by t; layer
norms and row-parallel biases are replicated on every TP rank; the vocabulary is padded to a
multiple of 128*t; a GPT model adds learned positions on the first stage.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from traceforge.spec import V_SHAPED, Spec
from traceforge.spec_cache import ignoring


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


def attention_output_channels(spec: Spec) -> int:
    """Channels of attention's output, into the output projection: every query head's values
    (under GQA the value channels of qkv_channels count only the shared KV heads')."""
    return spec.heads * (spec.v_head_dim if spec.mla else spec.head_dim)


def mla_latent_channels(spec: Spec) -> int:
    """What MLA's column-parallel up projections take per token: the query latent (or, with the
    query not compressed, the hidden state itself, which linear_q_proj takes), the KV latent and
    the shared rope key. With sequence parallelism this is what the TP group gathers (Megatron's
    multi_latent_attention.py _qkv_down_projection gathers the compressed q and kv, and
    q_compressed = hidden_states without a q_lora_rank)."""
    return (spec.q_lora_rank or spec.hidden) + spec.kv_lora_rank + spec.qk_rope_head_dim


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


def _even_with_outer_shortfall(layers: int, p: int) -> list[int]:
    """ceil(L/p) per stage, any shortfall taken from the outer stages first (last, first,
    second-last, ...), which hold the LM head and embedding (as Llama 3 405B did)."""
    base = -(-layers // p)
    counts = [base] * p
    # outer stages first: last, first, second-last, second, ... (each once; linear in p)
    order = dict.fromkeys(s for pair in zip(range(p - 1, -1, -1), range(p), strict=True) for s in pair)
    for stage in list(order)[:base * p - layers]:
        counts[stage] -= 1
    return counts


def _first_last(layers: int, slots: int, first: int | None, last: int | None) -> list[int]:
    """Megatron's uneven split: the first/last counts as given, the rest even over the middle."""
    middle = layers - (first or 0) - (last or 0)
    left = slots - (first is not None) - (last is not None)
    counts = [middle // left if left else 0] * slots
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def virtual_stage_layer_counts(spec: Spec) -> list[int]:
    """Layers of each of the model's p*v virtual stages, in model order (Megatron's
    get_num_layers_to_build / get_transformer_layer_offset rules):
    - --layers-per-stage as given (one chunk per stage);
    - --decoder-first/last-pipeline-num-layers: those on the first/last stage, the rest even
      over the middle stages; each stage's layers split evenly over its chunks, virtual stage
      c*p + i getting stage i's share (the V schedules split over their 2p virtual stages);
    - --account-for-embedding/loss-in-pipeline-split: the embedding (loss) counts as one layer
      of the first (last) virtual stage, then (L + 1 + 1) / (p*v) per virtual stage;
    - otherwise even, with one chunk per stage any shortfall from the outer stages."""
    p, v = spec.pp, spec.virtual_stages
    v_shaped = spec.schedule in V_SHAPED
    n = p * v
    first, last = spec.decoder_first_pipeline_num_layers, spec.decoder_last_pipeline_num_layers
    if spec.layers_per_stage:
        return list(spec.layers_per_stage)
    if first is not None or last is not None:
        if v_shaped:
            return _first_last(spec.layers, n, first, last)
        per_stage = _first_last(spec.layers, p, first, last)
        return [per_stage[vs % p] // v for vs in range(n)]
    counts = split_counts(spec.layers, p, n, spec.account_for_embedding_in_pipeline_split,
                          spec.account_for_loss_in_pipeline_split)
    assert counts is not None  # the spec's validator refused a split without whole chunks
    return counts


def split_counts(layers: int, p: int, n: int, emb: bool = False, loss: bool = False) -> list[int] | None:
    """Layers of each of n virtual stages over p stages: the embedding (loss) as one layer of the
    first (last) virtual stage, then (L + emb + loss) / n each; otherwise even, with one chunk per
    stage any shortfall from the outer stages. None when the chunks would not be whole."""
    if emb or loss:
        if (layers + emb + loss) % n:
            return None
        counts = [(layers + emb + loss) // n] * n
        counts[0] -= emb
        counts[-1] -= loss
        return counts
    if n == p:
        return _even_with_outer_shortfall(layers, p)
    return None if layers % n else [layers // n] * n


@functools.lru_cache(maxsize=8)
def virtual_stage_layers(spec: Spec) -> tuple[range, ...]:
    """Global layer indices of each virtual stage, in model order. Linear in p*v and cached:
    every stage asks."""
    starts = [0, *itertools.accumulate(virtual_stage_layer_counts(spec))]
    return tuple(range(a, b) for a, b in itertools.pairwise(starts))


def stage_layer_ranges(spec: Spec) -> tuple[range, ...]:
    """Global layer indices per stage with one chunk per stage."""
    return virtual_stage_layers(spec)[:spec.pp]


@dataclass(frozen=True)
class Chunk:
    """A contiguous run of layers one stage executes as a unit (a virtual stage when
    interleaved). The embedding sits on the model's first chunk, the LM head on its last."""

    stage: int
    index: int
    layers: range
    first: bool
    last: bool


# What a stage's chunks and parameters never read: the planner asks for them for every candidate
# (memoized on the rest, spec_cache; tests/test_spec_cache.py checks they are not read).
NOT_READ_BY_STAGE_LAYOUT = ("micro_batch", "num_microbatches", "recompute", "dp", "world_size", "dp_mode", "shard_size",
                            "bucket_mb", "overlap_grad_reduce", "overlap_param_gather")


def model_chunks(spec: Spec, stage: int) -> list[Chunk]:
    """The stage's chunks: chunk c is virtual stage c*p + stage when interleaved, stage and
    2p-1-stage in a V (virtual_stage)."""
    return list(_model_chunks(spec, stage))


@ignoring(*NOT_READ_BY_STAGE_LAYOUT)
def _model_chunks(spec: Spec, stage: int) -> tuple[Chunk, ...]:
    ranges = virtual_stage_layers(spec)
    n = len(ranges)
    chunks = []
    for c in range(spec.virtual_stages):
        vs = virtual_stage(spec, stage, c)
        chunks.append(Chunk(stage, c, ranges[vs], vs == 0, vs == n - 1))
    return tuple(chunks)


def virtual_stage(spec: Spec, stage: int, chunk: int) -> int:
    """The model-order index of a stage's chunk among the p*v virtual stages."""
    if spec.schedule in V_SHAPED:
        return stage if chunk == 0 else 2 * spec.pp - 1 - stage
    return chunk * spec.pp + stage


def placement(spec: Spec, vstage: int) -> tuple[int, int]:
    """(stage, chunk) holding a virtual stage: the inverse of virtual_stage."""
    p = spec.pp
    if spec.schedule in V_SHAPED:
        return (vstage, 0) if vstage < p else (2 * p - 1 - vstage, 1)
    return vstage % p, vstage // p


def embedding_stages(spec: Spec) -> tuple[int, int]:
    """(stage of the word embedding, stage of the LM head): 0 and p-1, both 0 in a V."""
    return placement(spec, 0)[0], placement(spec, spec.pp * spec.virtual_stages - 1)[0]


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


@ignoring(*NOT_READ_BY_STAGE_LAYOUT)
def stage_params(spec: Spec, stage: int) -> StageParams:
    t, h = spec.tp, spec.hidden
    chunks = model_chunks(spec, stage)
    layers = tuple(layer for chunk in chunks for layer in chunk.layers)
    params = {layer: layer_params(spec, layer) for layer in layers}
    first, last = any(c.first for c in chunks), any(c.last for c in chunks)
    word = padded_vocab(spec) * h // t
    final_norm = 2 * h if spec.arch == "gpt" else h
    embedding = 0
    if first:
        positions = spec.max_position_embeddings * h if spec.arch == "gpt" else 0  # learned, replicated
        embedding = word + positions
    head = 0
    if last:
        # Untied: its own output layer. Tied with the embedding elsewhere: a second copy of the
        # word embedding. Tied on the embedding's own stage (p == 1, or a V): that copy serves.
        output = 0 if (spec.tied_embeddings and first) else word
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
        n += spec.max_position_embeddings * h
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
    the attention (attention_param_list), then the MLP's linear_fc1 (norm first) and
    linear_fc2, or the norm, the router, the local experts' fc1 and fc2 and the shared experts'
    fc1 and fc2 (moe_layer.py builds router, experts, shared_experts in that order). (Megatron-LM
    core/transformer/{transformer_layer,attention,mlp}.py; TransformerEngine registers a
    LayerNormLinear's norm weight and bias before its weight and bias.) Sums to
    layer_params(...).per_rank(t), and its experts' to layer_params(...).expert / t
    (tests/test_model_params.py)."""
    h, t, gpt = spec.hidden, spec.tp, spec.arch == "gpt"
    norm = [Param("norm_weight", h)] + ([Param("norm_bias", h)] if gpt else [])
    out = attention_param_list(spec, norm)

    def fc1(prefix: str, f: int, expert: bool = False) -> list[Param]:
        weight = h * f // t if gpt else 2 * h * f // t  # Llama's gate and up projections in one weight
        return [Param(f"{prefix}fc1_weight", weight, expert)] + ([Param(f"{prefix}fc1_bias", f // t, expert)] if gpt else [])

    if is_moe_layer(spec, layer):
        f, local = spec.moe_ffn_hidden, spec.experts // spec.ep
        out += norm + [Param("router_weight", spec.experts * h)]
        for e in range(local):
            out += fc1(f"expert{e}_", f, expert=True)
        out += [Param(f"expert{e}_fc2_weight", f * h // t, expert=True) for e in range(local)]
        if spec.shared_experts:  # one TP-split MLP of shared_experts x moe_ffn_hidden (SharedExpertMLP)
            shared = spec.shared_experts * f
            out += fc1("shared_", shared) + [Param("shared_fc2_weight", shared * h // t)]
        return out + ([Param("fc2_bias", h)] if gpt else [])  # one replicated output bias, as layer_params counts
    f = spec.ffn_hidden
    out += norm + fc1("", f)
    return out + [Param("fc2_weight", f * h // t)] + ([Param("fc2_bias", h)] if gpt else [])


def attention_param_list(spec: Spec, norm: list[Param]) -> list[Param]:
    """The attention block's parameters per TP rank, its input norm included, in registration
    order: linear_proj, then linear_qkv with the norm fused before it; MLA (multi_latent_attention.py):
    the input norm on its own, linear_proj, the query's down projection and its norm with the up
    projection (or one linear_q_proj), the key/value down projection, its norm with the up
    projection. Down projections and their norms are whole on every TP rank."""
    h, t, gpt = spec.hidden, spec.tp, spec.arch == "gpt"
    q, k, v = qkv_channels(spec)
    if spec.mla:
        ql, kl, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.qk_rope_head_dim
        query = ([Param("q_down_weight", h * ql), Param("q_norm_weight", ql), Param("q_up_weight", ql * q // t)]
                 if ql else [Param("q_weight", h * q // t)])
        return [*norm, Param("proj_weight", v * h // t), *query, Param("kv_down_weight", h * (kl + rope)),
                Param("kv_norm_weight", kl), Param("kv_up_weight", kl * (k - spec.heads * rope + v) // t)]
    out = [Param("proj_weight", q * h // t)] + ([Param("proj_bias", h)] if gpt else [])
    return out + norm + [Param("qkv_weight", h * (q + k + v) // t)] + ([Param("qkv_bias", (q + k + v) // t)] if gpt else [])


def chunk_param_list(spec: Spec, chunk: Chunk) -> list[tuple[str, Param]]:
    """(unit, parameter) of one model chunk per TP rank, in registration order: the embedding
    (word, then learned positions), the layers, the final norm, the output layer (Megatron-LM
    core/models/gpt/gpt_model.py). Units are what ZeRO-3 gathers: embed, L<i>, head."""
    # A V schedule (or one stage) holds the embedding and the LM head on stage 0: a tied word
    # embedding is then one parameter there, as in stage_params, with no other stage to share it.
    emb_stage, head_stage = embedding_stages(spec)
    together = emb_stage == head_stage
    h, shared = spec.hidden, spec.tied_embeddings and not together
    word = padded_vocab(spec) * h // spec.tp
    out: list[tuple[str, Param]] = []
    if chunk.first:
        out.append(("embed", Param("word_embeddings", word, shared_embedding=shared)))
        if spec.arch == "gpt":
            out.append(("embed", Param("position_embeddings", spec.max_position_embeddings * h)))
    for layer in chunk.layers:
        out += [(f"L{layer}", p) for p in layer_param_list(spec, layer)]
    if chunk.last:
        out.append(("head", Param("final_norm_weight", h)))
        if spec.arch == "gpt":
            out.append(("head", Param("final_norm_bias", h)))
        if not (spec.tied_embeddings and together):  # tied on the embedding's own stage: the embedding serves
            out.append(("head", Param("output_layer", word, shared_embedding=shared)))
    return out
