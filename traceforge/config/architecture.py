"""The model's shape: layers, widths, heads (GQA and multi-head latent attention), positions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceforge.base.errors import SpecError
from traceforge.config.raw import Raw

# What each architecture implies when a spec does not say: its defaults, which a spec that names
# the architecture takes from here, never from the preset under it (a Llama spec over the demo
# preset has untied embeddings, as Llama models do, not the GPT demo's tied ones).
ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt": {"tied_embeddings": True},  # GPT-2/3 share the embedding and the LM head
    "llama": {"tied_embeddings": False},  # Llama 2/3, Mixtral, DeepSeek, Qwen3-MoE: untied
}


def arch_defaults(spec: Mapping[str, Any], preset: Mapping[str, Any]) -> dict[str, str]:
    """Where each of a spec's architecture defaults came from when it is not the preset's value:
    field -> "arch NAME" (the manifest's ``defaults``, the report's label). Empty for a spec
    whose architecture is its preset's, or any spec that is not a dict of ours."""
    arch = spec.get("arch")
    if not isinstance(arch, str) or arch == preset.get("arch"):
        return {}
    return {k: f"arch {arch}" for k, v in ARCH_DEFAULTS.get(arch, {}).items()
            if spec.get(k) == v and preset.get(k, v) != v}


def normalize(r: Raw, _: dict) -> dict:
    arch = r.need("arch")
    layers, hidden, heads, vocab, seq_len = (r.need(k) for k in ("layers", "hidden", "heads", "vocab", "seq_len"))
    kv_heads = r.get("kv_heads", heads)
    head_dim = r.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise SpecError(f"hidden ({hidden}) must be divisible by heads ({heads}), or give --head-dim")
        head_dim = hidden // heads
    if kv_heads > heads or heads % kv_heads:
        raise SpecError(f"kv_heads ({kv_heads}) must divide heads ({heads})")
    kv_lora = r.get("kv_lora_rank", 0)
    mla = dict(q_lora_rank=r.get("q_lora_rank", 0), kv_lora_rank=kv_lora, qk_nope_head_dim=r.get("qk_nope_head_dim", 128),
               qk_rope_head_dim=r.get("qk_rope_head_dim", 64), v_head_dim=r.get("v_head_dim", 128))
    if not kv_lora:
        for name in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if name in r.explicit and r.explicit[name] != 0:
                raise SpecError(f"{name} applies to multi-head latent attention: give --kv-lora-rank R too, or drop it")
        mla = dict(q_lora_rank=0, kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0)
    elif not mla["qk_nope_head_dim"] or not mla["v_head_dim"]:
        raise SpecError("multi-head latent attention needs qk_nope_head_dim and v_head_dim of at least 1")
    elif arch != "llama":
        raise SpecError("multi-head latent attention (kv_lora_rank) is modelled for arch llama (no biases, SwiGLU): use --arch llama")
    elif kv_heads != heads:
        raise SpecError(f"multi-head latent attention has no key/value head groups: drop kv_heads ({kv_heads}) or set it to heads ({heads})")
    qk_norm = bool(r.get("qk_norm", False))
    if qk_norm and kv_lora:
        raise SpecError("qk_norm normalizes each head's query and key; multi-head latent attention normalizes its "
                        "latents instead: drop --qk-norm or --kv-lora-rank")
    ffn_hidden = r.get("ffn_hidden", 4 * hidden)
    positions = r.get("max_position_embeddings", seq_len)
    if positions < seq_len:
        raise SpecError(f"max_position_embeddings ({positions}) must be at least seq_len ({seq_len}): "
                        "every token of a sequence looks up its position")
    return dict(arch=arch, layers=layers, hidden=hidden, ffn_hidden=ffn_hidden, heads=heads,
                kv_heads=kv_heads, head_dim=head_dim, **mla, vocab=vocab, seq_len=seq_len,
                max_position_embeddings=positions,
                tied_embeddings=r.get("tied_embeddings", ARCH_DEFAULTS[arch]["tied_embeddings"]), qk_norm=qk_norm)
