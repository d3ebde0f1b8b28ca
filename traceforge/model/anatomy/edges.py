"""The model's edges: the vocab-parallel word embedding (and gpt's learned positions) on the
first chunk; the final norm, the vocab-parallel LM head and the fp32 cross-entropy on the last
(Megatron-LM core/models/gpt/gpt_model.py registers them in that order)."""

from __future__ import annotations

from traceforge.config import Layer
from traceforge.model.anatomy.parts import CROSS_ENTROPY, NORM, Linear, Lookup, Op, Pointwise, Weight
from traceforge.model.anatomy.sizes import Sizes, padded_vocab


def embedding_ops(spec: Layer, vocab: int | None = None, tokens: int = 0) -> tuple[Op, ...]:
    """The word embedding lookup of this rank's vocabulary slice; gpt adds learned positions
    (whole on every TP rank). `vocab`: the rows counted (default: the padded vocabulary);
    tokens: the micro-batch's local tokens, 0 for the weights alone (Sizes.of), as for every
    edge op here."""
    z = Sizes.of(spec, tokens)
    rows = padded_vocab(spec) if vocab is None else vocab
    word = Op("word_embeddings", "embed", (Lookup(z.T * z.h, rows // z.t * z.h),), (Weight("word_embeddings", rows * z.h),))
    if not z.gpt:
        return (word,)
    return word, Op("position_embeddings", "embed", weights=(
        Weight("position_embeddings", spec.max_position_embeddings * z.h, split=False),))


def final_norm_op(spec: Layer, tokens: int = 0) -> Op:
    z = Sizes.of(spec, tokens)
    weights: tuple[Weight, ...] = (Weight("final_norm_weight", z.h, split=False),)
    weights += (Weight("final_norm_bias", z.h, split=False),) if z.gpt else ()
    return Op("final_norm", "head", (Pointwise(NORM, z.seq * z.h),), weights)


def output_ops(spec: Layer, vocab: int | None = None, tokens: int = 0) -> tuple[Op, ...]:
    """The column-parallel output layer (in the model's dtype under --fp8) and the cross-entropy
    on its fp32 logits, V/t per token on this rank."""
    z = Sizes.of(spec, tokens)
    rows = padded_vocab(spec) if vocab is None else vocab
    return (Op("output_layer", "head", (Linear(z.T, z.h, rows // z.t, layer_dtype=False),),
               (Weight("output_layer", rows * z.h),)),
            Op("cross_entropy", "head", (Pointwise(CROSS_ENTROPY, z.T * rows // z.t),)))
