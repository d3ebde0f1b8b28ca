"""The spec's fields: the table of keys (type, help line, allowed values) that the CLI flags, the
config files and the docs share, and the normalized Spec those keys become."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from traceforge.config.dp_modes import DP_MODE_ALIASES, DP_MODES
from traceforge.config.schedules import SCHEDULES
from traceforge.config.views import DTYPE_BYTES, LayerRun, Placement, TraceConfig
from traceforge.machine.gpus import GPUS

__all__ = ["DTYPE_BYTES", "FIELDS", "FIELD_BY_NAME", "Field", "SPEC_KEYS", "Spec", "spec_fields"]


@dataclass(frozen=True)
class Field:
    """One spec key: its type, help line (shared by --help and the docs) and allowed values."""

    name: str
    kind: type
    help: str
    choices: tuple[str, ...] = ()
    # Flag spelling for booleans: (on, off).
    bool_flags: tuple[str, str] | None = None
    keep_case: bool = False  # strings that hold paths are not lowercased
    repeatable: bool = False  # a flag given once per item (lists only)
    minimum: float = 1  # smallest allowed value
    maximum: float = 2**31 - 1  # largest allowed value (bounds every product the planner forms)


FIELDS: tuple[Field, ...] = (
    # model
    Field("arch", str, "Model family: gpt (biases, GELU MLP, learned positions) or llama (GQA, SwiGLU, no biases).", ("gpt", "llama")),
    Field("layers", int, "Transformer layers."),
    Field("hidden", int, "Hidden size h."),
    Field("ffn_hidden", int, "MLP inner size f (default 4h)."),
    Field("heads", int, "Attention heads."),
    Field("kv_heads", int, "Key/value heads (GQA query groups; default = heads)."),
    Field("head_dim", int, "Channels per attention head (Megatron's kv_channels; default hidden/heads)."),
    Field("q_lora_rank", int, "Multi-head latent attention: rank of the compressed query (0 = queries not compressed).", minimum=0),
    Field("kv_lora_rank", int, "Multi-head latent attention (DeepSeek-V2/V3): rank of the compressed key/value latent (0 or unset = standard attention).", minimum=0),
    Field("qk_nope_head_dim", int, "MLA: per-head query/key channels without rotary embedding (default 128).", minimum=0),
    Field("qk_rope_head_dim", int, "MLA: per-head query/key channels with rotary embedding, the key's shared by all heads (default 64).", minimum=0),
    Field("v_head_dim", int, "MLA: per-head value channels (default 128).", minimum=0),
    Field("vocab", int, "Vocabulary size (padded to a multiple of 128*tp, as Megatron does)."),
    Field("seq_len", int, "Sequence length s in tokens."),
    Field("max_position_embeddings", int, "Rows of a gpt model's learned position-embedding table, Megatron's --max-position-embeddings (default seq_len; at least seq_len; no parameters with llama's rotary embeddings)."),
    Field("tied_embeddings", bool, "Share input embedding and LM head weights (default: gpt yes, llama no).",
          bool_flags=("--tied-embeddings", "--untied-embeddings")),
    Field("qk_norm", bool, "A norm over each head's query and key after the QKV projection (Megatron's --qk-layernorm; "
          "Qwen3's q_norm/k_norm; default off, on in the Qwen3 preset).", bool_flags=("--qk-norm", "--no-qk-norm")),
    # parallelism
    Field("tp", int, "Tensor-parallel size t."),
    Field("cp", int, "Context-parallel size (ring attention over sequence chunks; default 1)."),
    Field("pp", int, "Pipeline-parallel size p (stages)."),
    Field("dp", int, "Data-parallel size d (derived from --world-size when that is given)."),
    Field("ep", int, "Expert-parallel size (divides dp*cp; default 1)."),
    Field("world_size", int, "Total GPUs; must equal tp*cp*pp*dp (give it instead of --dp to derive dp)."),
    Field("order", str, "Rank order, innermost dimension first, e.g. tp-pp-dp (default) or megatron (= tp-cp-ep-dp-pp); a missing cp or ep is inserted where Megatron puts it."),
    Field("order_unchecked", bool, "Plan rank orders Megatron refuses (pp not outermost with cp or ep > 1, unless ep = cp).",
          bool_flags=("--order-unchecked", "--order-checked")),
    Field("cp_comm_type", str, "Context-parallel attention: p2p (ring), all-gather (of K,V, as Llama 3) or a2a (Ulysses AllToAll of heads).",
          ("p2p", "all-gather", "a2a")),
    # training step
    Field("micro_batch", int, "Micro-batch size b in sequences."),
    Field("global_batch", int, "Global batch in sequences; micro-batches per step m = global_batch / (b*dp)."),
    Field("num_microbatches", int, "Micro-batches per step m (instead of --global-batch)."),
    Field("dtype", str, "Parameter/activation dtype.", ("bf16", "fp16", "fp32")),
    Field("grad_dtype", str, "Gradient dtype as reduced (default fp32, as Megatron's main grads).", ("bf16", "fp16", "fp32")),
    Field("sequence_parallel", bool, "Megatron sequence parallelism: TP AllGather/ReduceScatter instead of AllReduce.",
          bool_flags=("--sequence-parallel", "--no-sequence-parallel")),
    Field("experts", int, "Mixture-of-experts: experts per MoE layer (0 or unset = dense).", minimum=0),
    Field("top_k", int, "Mixture-of-experts: experts each token is routed to (default 2).", minimum=0),
    Field("moe_layer_freq", int, "Mixture-of-experts: every k-th layer is an MoE layer (default 1: all)."),
    Field("moe_first_dense_layers", int, "Mixture-of-experts: the first k layers are dense (DeepSeek's first_k_dense_replace; default 0).", minimum=0),
    Field("moe_ffn_hidden", int, "Mixture-of-experts: inner size of one expert (fine-grained experts; default ffn_hidden)."),
    Field("shared_experts", int, "Mixture-of-experts: shared experts every token passes through, next to the routed ones (default 0).", minimum=0),
    Field("moe_router_num_groups", int, "Node-limited routing: the EP group's ranks split into this many groups (nodes); > 1 dispatches across groups once per token, then inside the group (default 1: flat AllToAll)."),
    Field("moe_router_group_topk", int, "Node-limited routing: groups (nodes) each token reaches at most (default: all groups)."),
    Field("moe_routing", str, "Mixture-of-experts routing: balanced (AllToAll), zipf:S (expert popularity ~ 1/i^S, drawn with --seed) or trace:FILE (.npy/.json token counts [m, moe_layers, ep, ep]); uneven counts become Send/Recv pairs.",
          keep_case=True),
    Field("seed", int, "Seed of every random draw (zipf routing, compute jitter); same seed, same bytes (default 0).", minimum=0),
    Field("recompute", str, "Activation recomputation: full replays each layer's forward (and its TP collectives) in backward; selective only attention's core.",
          ("none", "selective", "full")),
    Field("schedule", str, "Pipeline schedule: 1f1b, gpipe, interleaved (Megatron), zb-h1, interleaved-zb, zbv (zero bubble), "
          "dualpipev (DeepSeek); see docs/pipeline-schedules.md.",
          tuple(SCHEDULES)),
    Field("virtual_stages", int, "Model chunks per stage for --schedule interleaved or interleaved-zb "
          "(Megatron's virtual pipeline size; zbv and dualpipev use 2)."),
    Field("layers_per_stage", list, "Layers on each stage, comma-separated (e.g. 7,8,...,8,7); default: even, shortfall from the outer stages."),
    Field("decoder_first_pipeline_num_layers", int,
          "Layers on the first pipeline stage; the rest are split evenly over the middle stages (Megatron)."),
    Field("decoder_last_pipeline_num_layers", int,
          "Layers on the last pipeline stage; the rest are split evenly over the middle stages (Megatron)."),
    Field("account_for_embedding_in_pipeline_split", bool,
          "Count the embedding as one layer of the first stage when splitting layers (Megatron).",
          bool_flags=("--account-for-embedding-in-pipeline-split", "--no-account-for-embedding-in-pipeline-split")),
    Field("account_for_loss_in_pipeline_split", bool,
          "Count the LM head and loss as one layer of the last stage when splitting layers (Megatron).",
          bool_flags=("--account-for-loss-in-pipeline-split", "--no-account-for-loss-in-pipeline-split")),
    Field("overlap_p2p_comm", bool, "Pipeline sends run alongside the next compute (default: the compute after a send waits for it, "
          "as Megatron without --overlap-p2p-comm; torch's schedules, gpipe, zb-h1, interleaved-zb, zbv and dualpipev, "
          "never wait on a send before the step's end).", bool_flags=("--overlap-p2p-comm", "--no-overlap-p2p-comm")),
    Field("pipeline_scatter_gather", str, "Pipeline sends split over the TP ranks, as frameworks of 2021-22 ran them (default off, as "
          "Megatron-Core): megatron (Megatron-LM's scatter_gather_tensors_in_pipeline, on by default from 2021-02 until 2023-01: each TP "
          "rank sends 1/t of the activation or gradient, the receiver all-gathers it over TP) or deepspeed (its pipeline engine's "
          "pipe_partitioned and grad_partitioned: the same, and a stage all-gathers its own sent output before its backward); "
          "no effect with --sequence-parallel (the message is 1/t already); docs/megatron-parity.md.",
          ("off", "megatron", "deepspeed")),
    Field("dp_mode", str, "Data-parallel mode: ddp, zero1, zero2, dist-opt (Megatron distributed optimizer), zero3 (fsdp), hsdp (FSDP HYBRID_SHARD).",
          tuple(name for mode in DP_MODES for name in (mode, *(a for a, m in DP_MODE_ALIASES.items() if m == mode)))),
    Field("shard_size", int, "hsdp: shard parameters within groups of this many DP ranks, replicate across them."),
    Field("bucket_mb", float, "Gradient bucket size in MiB (default: zero2 DeepSpeed's 5e8 elements; other modes Megatron's, max(4e7, 1e6*dp) elements with --overlap-grad-reduce on the first stage's first chunk; 0 = one bucket).",
          minimum=0, maximum=1e9),
    Field("overlap_grad_reduce", bool, "Issue each gradient bucket as soon as the last micro-batch's backward has produced it.",
          bool_flags=("--overlap-grad-reduce", "--no-overlap-grad-reduce")),
    Field("overlap_param_gather", bool, "Sharded optimizers: overlap the parameter AllGather with the next forward.",
          bool_flags=("--overlap-param-gather", "--no-overlap-param-gather")),
    Field("sync_collectives", bool, "The small synchronising collectives Megatron runs by default: TP batch broadcast, "
          "grad-norm and loss AllReduces, found-inf (fp16), MoE routing counts.",
          bool_flags=("--sync-collectives", "--no-sync-collectives")),
    Field("attention_mask_in_dataloader", bool, "Broadcast the b*s*s attention mask with each batch (Megatron's default; "
          "its --no-create-attention-mask-in-dataloader drops it).",
          bool_flags=("--attention-mask-in-dataloader", "--no-attention-mask-in-dataloader")),
    Field("steps", int, "Training steps to emit."),
    Field("straggler", list, "A slow GPU: RANK:FACTOR multiplies every compute duration of that rank (repeatable, e.g. --straggler 5:1.3).",
          repeatable=True),
    Field("compute_jitter", float, "Per-node compute jitter: each compute duration times exp(SIGMA*z), z ~ N(0,1) drawn per rank with --seed (default 0).",
          minimum=0, maximum=10),
    Field("gpu", str, "GPU model for compute durations (custom: give --gpu-tflops and --gpu-hbm-gbps).",
          (*GPUS, "custom")),
    Field("gpu_tflops", float, "Dense peak TFLOP/s in --dtype (default: the GPU's datasheet figure).", minimum=1e-3, maximum=1e9),
    Field("gpu_hbm_gbps", float, "HBM bandwidth in GB/s (default: the GPU's datasheet figure).", minimum=1e-3, maximum=1e9),
    Field("attention", str, "Attention kernel: flash (FlashAttention; default), flash1 (FlashAttention-1's generation: v1 or its Triton port, "
          "as llm-foundry's attn_impl triton ran in 2023; A100, H100, H200) or unfused (scores materialized and soft-maxed in HBM, as Megatron-LM before FlashAttention).",
          ("flash", "flash1", "unfused")),
    Field("bias_fusion", bool, "Megatron's fused bias-GeLU and bias-dropout-add kernels (default on, as Megatron today); "
          "--no-bias-fusion: separate bias, GeLU, dropout and residual-add kernels (--no-bias-gelu-fusion --no-bias-dropout-fusion).",
          bool_flags=("--bias-fusion", "--no-bias-fusion")),
    Field("gradient_accumulation_fusion", bool, "Weight-gradient GEMMs accumulate into the main grads (Megatron's default since 2022); "
          "--no-gradient-accumulation-fusion: a separate add of every weight gradient per micro-batch, as Megatron-LM before it.",
          bool_flags=("--gradient-accumulation-fusion", "--no-gradient-accumulation-fusion")),
    Field("gpu_efficiency", float, "Override: one flat fraction of peak FLOP/s and bandwidth for every kernel (default: the GPU preset's per-kernel calibration; 0.5 for custom).",
          minimum=1e-3, maximum=1),
    # measured kernel times and TransformerEngine's overlap and FP8 (docs/kernel-times.md, docs/traffic-model.md)
    Field("kernel_times", str, "Measured kernel times that replace the compute model per kernel: a table (kind, shape, dtype, us; CSV or JSON) or a PyTorch profiler trace of one step (docs/kernel-times.md).",
          keep_case=True),
    Field("tp_comm_overlap", bool, "TransformerEngine's TP communication overlap (userbuffers): SP AllGathers as ring exchanges and ReduceScatters in chunks, pipelined with their GEMMs; needs --sequence-parallel.",
          bool_flags=("--tp-comm-overlap", "--no-tp-comm-overlap")),
    Field("fp8", str, "TransformerEngine FP8 GEMMs (recipe hybrid: E4M3 forward, E5M2 gradients; or e4m3): layer GEMMs at the GPU's FP8 rate, SP AllGathers in 1-byte elements; none by default.",
          ("none", "hybrid", "e4m3")),
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}


# The order a spec's keys take in manifest.json and every document that carries a spec: the order
# sets have always been written with (a Spec's fields come from its parts, config/views.py, in
# theirs).
SPEC_KEYS = (
    "arch", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "head_dim", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "vocab", "seq_len", "max_position_embeddings",
    "tied_embeddings", "qk_norm", "tp", "cp", "ep", "pp", "dp", "world_size", "order", "order_unchecked",
    "cp_comm_type", "micro_batch", "global_batch", "num_microbatches", "dtype", "grad_dtype", "sequence_parallel",
    "recompute", "experts", "top_k", "moe_layer_freq", "moe_first_dense_layers", "moe_ffn_hidden", "shared_experts",
    "moe_router_num_groups", "moe_router_group_topk", "moe_routing", "seed", "straggler", "compute_jitter",
    "schedule", "virtual_stages", "layers_per_stage", "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "overlap_p2p_comm", "pipeline_scatter_gather", "dp_mode", "shard_size", "bucket_mb",
    "overlap_grad_reduce", "overlap_param_gather", "sync_collectives", "attention_mask_in_dataloader", "steps", "gpu",
    "gpu_tflops", "gpu_hbm_gbps", "gpu_efficiency", "attention", "bias_fusion", "gradient_accumulation_fusion",
    "kernel_times", "tp_comm_overlap", "fp8", "preset",
)


# Keys added after sets were first written, left out of a spec's documents (manifest.json, a
# written plan's spec) while at the value that reproduces the behaviour before them.
OMITTED_AT_DEFAULT: dict[str, Any] = {"pipeline_scatter_gather": "off"}


@dataclass(frozen=True)
class Spec(LayerRun, Placement, TraceConfig):
    """A normalized spec: every value explicit and every combination checked. Its fields are its
    parts' (config/views.py: model, sharding, machine, pipeline, data, training, trace), and a
    Spec is each part and each composite of them: a function that reads only the model takes a
    ModelConfig and is given a Spec; ``spec.model`` (``.layer``, ``.placement``, ...) is the part
    alone, what a memo of that function keys on."""

    def to_dict(self) -> dict[str, Any]:
        """As JSON holds it (tuples as lists), so a spec read back from a manifest compares equal.
        A key of OMITTED_AT_DEFAULT is left out at its default: the documents of a spec that does
        not use it read byte for byte as before the key existed (and a document without it
        builds the default)."""
        def plain(value: Any) -> Any:
            return [plain(v) for v in value] if isinstance(value, tuple) else value

        return {k: plain(getattr(self, k)) for k in SPEC_KEYS
                if k not in OMITTED_AT_DEFAULT or getattr(self, k) != OMITTED_AT_DEFAULT[k]}

    def __repr__(self) -> str:
        return f"Spec({', '.join(f'{k}={getattr(self, k)!r}' for k in SPEC_KEYS)})"


def spec_fields() -> tuple[dataclasses.Field, ...]:
    """Spec's fields in the order documents carry them (SPEC_KEYS)."""
    by_name = {f.name: f for f in dataclasses.fields(Spec)}
    return tuple(by_name[name] for name in SPEC_KEYS)
