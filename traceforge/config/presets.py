"""Named specs: published model architectures with a common parallel layout.

Each preset is a complete flat spec mapping; flags and config files override any key.
Architectures follow the models' papers/configs; layouts are typical, not prescriptive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from traceforge.base.errors import SpecError

_TRAINING = dict(
    micro_batch=1, dtype="bf16", grad_dtype="fp32", sequence_parallel=False, recompute="none",
    schedule="1f1b", virtual_stages=1, dp_mode="ddp", overlap_grad_reduce=False, overlap_param_gather=False,
    steps=1, gpu="h100", order="tp-pp-dp",
)

PRESETS: dict[str, dict[str, Any]] = {
    # Tiny, the default: the README's 8-GPU example (t=p=d=2), tied embeddings so every group shows.
    "demo": dict(_TRAINING, arch="gpt", layers=4, hidden=512, ffn_hidden=2048, heads=8, kv_heads=8,
                 vocab=1024, seq_len=512, tied_embeddings=True, tp=2, pp=2, dp=2, global_batch=8),
    # GPT-3 (Brown et al. 2020, table 2.1); 175B layout from Narayanan et al. 2021 (t8 p16, b1536).
    "gpt3-13b": dict(_TRAINING, arch="gpt", layers=40, hidden=5120, ffn_hidden=20480, heads=40, kv_heads=40,
                     vocab=50257, seq_len=2048, tied_embeddings=True, tp=8, pp=4, dp=4, global_batch=128),
    "gpt3-175b": dict(_TRAINING, arch="gpt", layers=96, hidden=12288, ffn_hidden=49152, heads=96, kv_heads=96,
                      vocab=50257, seq_len=2048, tied_embeddings=True, tp=8, pp=16, dp=12, global_batch=1536),
    # Llama 2 (Touvron et al. 2023): 70B uses GQA with 8 KV heads.
    "llama2-70b": dict(_TRAINING, arch="llama", layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8,
                       vocab=32000, seq_len=4096, tied_embeddings=False, tp=8, pp=4, dp=4, global_batch=128),
    # Llama 3 (Dubey et al. 2024, table 3); 405B layout from section 3.3 (t8 p16 d128 on 16,384 GPUs).
    # Section 3.3.2: FSDP sharding optimizer states and gradients but not re-sharding parameters after
    # the forward (ZeRO-2), tensor parallelism with sequence parallelism, 8K sequences "without
    # activation checkpointing" (docs/memory.md).
    "llama3-8b": dict(_TRAINING, arch="llama", layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8,
                      vocab=128256, seq_len=8192, tied_embeddings=False, tp=4, pp=2, dp=4, global_batch=64),
    # 70B layout ours (not published); sequence parallelism and Megatron's distributed optimizer as every
    # Megatron/NeMo recipe for a model this size uses: without them a GPU would need about 106 GB.
    "llama3-70b": dict(_TRAINING, arch="llama", layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8,
                       vocab=128256, seq_len=8192, tied_embeddings=False, tp=8, pp=4, dp=4, global_batch=128,
                       sequence_parallel=True, dp_mode="dist-opt"),
    "llama3-405b": dict(_TRAINING, arch="llama", layers=126, hidden=16384, ffn_hidden=53248, heads=128, kv_heads=8,
                        vocab=128256, seq_len=8192, tied_embeddings=False, tp=8, pp=16, dp=128, global_batch=2048,
                        sequence_parallel=True, dp_mode="zero2"),
    # The same model on 131,072 GPUs (d1024), each GPU running the 16k layout's schedule: 16
    # micro-batches of 8,192 tokens, a 134M-token global batch. `--global-batch 2048` keeps the
    # paper's 16M-token batch instead (2 micro-batches per GPU). See docs/scale.md.
    "llama3-405b-131072gpu": dict(_TRAINING, arch="llama", layers=126, hidden=16384, ffn_hidden=53248, heads=128, kv_heads=8,
                             vocab=128256, seq_len=8192, tied_embeddings=False, tp=8, pp=16, dp=1024,
                             global_batch=16384, sequence_parallel=True, dp_mode="zero2"),
    # Mixtral 8x7B (Jiang et al. 2024, table 1): 8 experts, top-2 routing in every layer; layout as
    # Megatron-LM's examples/mixtral (tp1 pp4 ep8), pipeline outermost.
    "mixtral-8x7b": dict(_TRAINING, arch="llama", layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8,
                         vocab=32000, seq_len=4096, tied_embeddings=False, tp=1, pp=4, dp=8, ep=8, experts=8, top_k=2,
                         order="megatron", global_batch=256),
    # DeepSeek-V3 (DeepSeek-AI 2024, arXiv 2412.19437; architecture as its config.json): MLA, 1 shared
    # + 256 routed experts of 2048, top-8 over at most 4 of 8 node groups, first 3 layers dense.
    # 671B total without the 14B multi-token-prediction module (not modelled). Layout as the
    # report's section 3.2: 2048 GPUs, PP16, EP64 over 8 nodes, ZeRO-1 DP, no TP; its final
    # batch of 15360 sequences of 4096 tokens. H800 = H100 compute; 1F1B stands in for DualPipe.
    # Section 3.3.3 keeps memory down by recomputing norms and MLA up-projections and caching MoE inputs
    # in FP8, which we do not model; full recompute is the nearest setting we have (without it a GPU
    # would need about 164 GB of its 80).
    "deepseek-v3": dict(_TRAINING, arch="llama", layers=61, hidden=7168, ffn_hidden=18432, heads=128, kv_heads=128,
                        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                        vocab=129280, seq_len=4096, tied_embeddings=False, experts=256, top_k=8, shared_experts=1,
                        moe_ffn_hidden=2048, moe_first_dense_layers=3, moe_router_num_groups=8, moe_router_group_topk=4,
                        tp=1, pp=16, dp=128, ep=64, dp_mode="zero1", order="megatron", global_batch=15360,
                        recompute="full"),
    # Qwen3-235B-A22B (Qwen team 2025, arXiv 2505.09388, table 2 and its config.json): 94 layers,
    # 64 query / 4 KV heads of 128 channels, 128 experts of 1536, top-8, no shared experts.
    # Its per-head q/k RMSNorms (q_norm, k_norm: 2x128 weights a layer) are --qk-norm. Layout ours (not published).
    "qwen3-235b-a22b": dict(_TRAINING, arch="llama", layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4,
                            head_dim=128, qk_norm=True, vocab=151936, seq_len=4096, tied_embeddings=False, experts=128, top_k=8,
                            moe_ffn_hidden=1536, tp=4, sequence_parallel=True, pp=8, dp=8, ep=8, order="megatron",
                            global_batch=512),
}


# Old names that still work, each with a one-line note naming the new one (canonical_preset).
# "llama3-405b-128k" read as a 128K context; the preset is 131,072 GPUs at 8,192 tokens a sequence.
RENAMED = {"llama3-405b-128k": "llama3-405b-131072gpu"}

# Called with (old, new) when a renamed preset is resolved; the command line prints the note.
_on_renamed: list[Callable[[str, str], None]] = []


def on_renamed(hook: Callable[[str, str], None]) -> None:
    """Have ``hook(old, new)`` told whenever a preset is named by its old name."""
    _on_renamed.append(hook)


def canonical_preset(name: str) -> str:
    """A preset's name as given, or its new name for one that was renamed (telling the hooks)."""
    key = name.strip().lower()
    if key in RENAMED:
        for hook in _on_renamed:
            hook(key, RENAMED[key])
        return RENAMED[key]
    return name


def get_preset(name: str) -> dict[str, Any]:
    key = RENAMED.get(name.strip().lower(), name.strip().lower())
    if key not in PRESETS:
        raise SpecError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)} (see 'traceforge presets')")
    return dict(PRESETS[key])
