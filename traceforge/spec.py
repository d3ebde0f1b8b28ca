"""The training spec: one validated, immutable description of model, layout and step.

A spec is assembled from three layers, later ones winning: a preset (default ``demo``), an
optional config file (YAML, TOML or JSON; flat keys named like the CLI flags in snake_case),
and CLI flags. ``build_spec`` merges them, fills every default explicitly and refuses every
impossible combination with one line naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceforge.errors import SpecError
from traceforge.files import MAX_SPEC_FILE_BYTES, input_file_problem, read_regular_file
from traceforge.schema import TAG_LIMIT

MEGATRON_ORDER = "tp-cp-ep-dp-pp"
ORDER_ALIASES = {"megatron": MEGATRON_ORDER}
KNOWN_DIMS = ("tp", "cp", "ep", "dp", "pp")
REQUIRED_DIMS = ("tp", "pp", "dp")

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DP_MODE_ALIASES = {"fsdp": "zero3"}
SHARDED_OPTIMIZER_MODES = ("zero1", "zero2", "dist-opt")

# ASTRA-sim keeps p2p tags below this; our tags grow with steps x micro-batches.
MAX_TAG = TAG_LIMIT
# Stated limits, checked before any planning: ranks in a set, and nodes in one rank's program
# (planning holds about 1 kB per node; the presets need at most about 7,000).
MAX_WORLD_SIZE = 1 << 22
MAX_NODES_PER_RANK = 1_000_000
# A straggler this many times slower than the rest is a typo, not a slow GPU.
MAX_STRAGGLER_FACTOR = 1000.0
# Upper bounds on nodes per layer and micro-batch (forward + backward, SP, CP ring, MoE), and per
# step outside the layers; measured on the planner, kept loose.
_NODES_PER_LAYER, _NODES_PER_CP_HOP, _NODES_PER_MOE_LAYER, _NODES_PER_STEP_LAYER = 40, 8, 40, 8


def estimated_nodes_per_rank(v: Mapping[str, Any], stage_layers: int, vs: int, steps: int, recompute: str) -> int:
    """A cheap upper estimate of one rank's node count, so huge specs are refused before planning."""
    per_layer = _NODES_PER_LAYER + _NODES_PER_CP_HOP * (v["cp"] - 1) + (_NODES_PER_MOE_LAYER if v["experts"] else 0)
    if recompute != "none":
        per_layer *= 2
    per_microbatch = stage_layers * per_layer + 16 * vs
    return steps * (v["num_microbatches"] * per_microbatch + stage_layers * _NODES_PER_STEP_LAYER + 64)


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
          ("1f1b", "gpipe", "interleaved", "zb-h1", "interleaved-zb", "zbv", "dualpipev")),
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
    Field("dp_mode", str, "Data-parallel mode: ddp, zero1, zero2, dist-opt (Megatron distributed optimizer), zero3 (fsdp), hsdp (FSDP HYBRID_SHARD).",
          ("ddp", "zero1", "zero2", "dist-opt", "zero3", "fsdp", "hsdp")),
    Field("shard_size", int, "hsdp: shard parameters within groups of this many DP ranks, replicate across them."),
    Field("bucket_mb", float, "Gradient bucket size in MiB (default: Megatron's max(4e7, 1e6*dp) elements; 0 = one bucket).",
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
          ("h100", "h200", "a100", "b200", "custom")),
    Field("gpu_tflops", float, "Dense peak TFLOP/s in --dtype (default: the GPU's datasheet figure).", minimum=1e-3, maximum=1e9),
    Field("gpu_hbm_gbps", float, "HBM bandwidth in GB/s (default: the GPU's datasheet figure).", minimum=1e-3, maximum=1e9),
    Field("attention", str, "Attention kernel: flash (FlashAttention; default) or unfused (scores materialized and soft-maxed in HBM, as Megatron-LM before FlashAttention).",
          ("flash", "unfused")),
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


@dataclass(frozen=True)
class Spec:
    """A normalized spec: every value explicit and every combination checked."""

    arch: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab: int
    seq_len: int
    max_position_embeddings: int
    tied_embeddings: bool
    tp: int
    cp: int
    ep: int
    pp: int
    dp: int
    world_size: int
    order: str
    order_unchecked: bool
    cp_comm_type: str
    micro_batch: int
    global_batch: int
    num_microbatches: int
    dtype: str
    grad_dtype: str
    sequence_parallel: bool
    recompute: str
    experts: int
    top_k: int
    moe_layer_freq: int
    moe_first_dense_layers: int
    moe_ffn_hidden: int
    shared_experts: int
    moe_router_num_groups: int
    moe_router_group_topk: int
    moe_routing: str
    seed: int
    straggler: tuple[tuple[int, float], ...]
    compute_jitter: float
    schedule: str
    virtual_stages: int
    layers_per_stage: tuple[int, ...] | None
    decoder_first_pipeline_num_layers: int | None
    decoder_last_pipeline_num_layers: int | None
    account_for_embedding_in_pipeline_split: bool
    account_for_loss_in_pipeline_split: bool
    overlap_p2p_comm: bool
    dp_mode: str
    shard_size: int | None
    bucket_mb: float | None
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    sync_collectives: bool
    attention_mask_in_dataloader: bool
    steps: int
    gpu: str
    gpu_tflops: float
    gpu_hbm_gbps: float
    gpu_efficiency: float | None  # None: the preset's per-kernel calibration (hardware.py)
    attention: str
    bias_fusion: bool
    gradient_accumulation_fusion: bool
    # measured kernel times, TransformerEngine overlap and FP8 (_engine)
    kernel_times: str | None
    tp_comm_overlap: bool
    fp8: str
    preset: str

    def to_dict(self) -> dict[str, Any]:
        """As JSON holds it (tuples as lists), so a spec read back from a manifest compares equal."""
        def plain(value: Any) -> Any:
            return [plain(v) for v in value] if isinstance(value, tuple) else value

        return {k: plain(v) for k, v in dataclasses.asdict(self).items()}

    @property
    def act_bytes(self) -> int:
        """Bytes per activation/parameter element (e)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element as reduced (g)."""
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3) instead of standard (GQA) attention."""
        return self.kv_lora_rank > 0

    @property
    def routing_groups(self) -> int:
        """EP routing groups (nodes) the dispatch crosses in two steps: the router's expert groups
        when each is a block of whole EP ranks, else 1 (Megatron limits the routing to M groups
        at any ep, with its one flat AllToAll; DeepSeek's node-limited two-step dispatch needs
        the groups to be the ranks' nodes)."""
        groups = self.moe_router_num_groups
        return groups if groups > 1 and self.ep % groups == 0 else 1

    @property
    def node_limited(self) -> bool:
        """Expert dispatch across routing groups (nodes) first, then inside them."""
        return self.routing_groups > 1

    @property
    def order_dims(self) -> tuple[str, ...]:
        return tuple(self.order.split("-"))


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """json object_pairs_hook: a key given twice is an error, not a silent last-wins."""
    out: dict[Any, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} is given twice")
        out[key] = value
    return out


def _yaml_load(text: str) -> Any:
    """yaml.safe_load without aliases (a flat spec needs none; an alias bomb would expand without
    end) and without duplicate keys."""
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise _DuplicateKey(f"line {mark.line + 1}: YAML aliases (*name) are not allowed in a spec file")
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
            keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
            seen: set[Any] = set()
            for key, (knode, _) in zip(keys, node.value, strict=True):
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: let the base class report it
                    continue
                if dup:
                    raise _DuplicateKey(f"line {knode.start_mark.line + 1}: key {key!r} is given twice")
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a flat spec mapping from YAML, TOML or JSON, chosen by the file's extension."""
    path = Path(path)
    fix = "give the path of a .yaml, .toml or .json spec"
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml", ".json"):
        problem = input_file_problem(path)
        if problem:
            raise SpecError(f"config file {path} {problem}: {fix}")
        raise SpecError(f"config file {path}: unknown extension {suffix!r}; use .yaml, .yml, .toml or .json")
    data_bytes = read_regular_file(path, "config file", MAX_SPEC_FILE_BYTES, fix, SpecError)
    try:
        text = data_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"config file {path} is not UTF-8 text: save it as a UTF-8 .yaml, .toml or .json file") from None
    try:
        if suffix in (".yaml", ".yml"):
            data = _yaml_load(text)
        elif suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            data = tomllib.loads(text)
        else:
            data = json.loads(text, object_pairs_hook=_unique_pairs)
    except Exception as exc:  # the parsers' own error types differ; all mean malformed input
        detail = " ".join(str(exc).split())[:300]  # bounded: a message may quote the input
        raise SpecError(f"config file {path} is not valid {suffix.lstrip('.').upper()}: {detail}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"config file {path} must hold a mapping of spec keys (e.g. 'tp: 2'), not a {type(data).__name__}")
    return data


def _coerce(name: str, value: Any) -> Any:
    """Check one raw value against its field's type and choices; return the normalized value."""
    field = FIELD_BY_NAME[name]
    if value is None:
        return None
    if field.kind is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{name} must be true or false, got {value!r}")
        return value
    if field.kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise SpecError(f"{name} must be a whole number, got {value!r}")
        if value < field.minimum:
            kind = "a positive whole number" if field.minimum == 1 else f"a whole number >= {field.minimum:g}"
            raise SpecError(f"{name} must be {kind}, got {value}")
        if value > field.maximum:
            raise SpecError(f"{name} must be at most {int(field.maximum):,}, got {value:,}")
        return value
    if name == "straggler":
        return _stragglers(value)
    if field.kind is list:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise SpecError(f"{name} must be a list of whole numbers, e.g. 7,8,8,7; got {value!r}")
        try:
            out = tuple(int(str(v).strip()) for v in items)
        except ValueError:
            raise SpecError(f"{name} must be a list of whole numbers, e.g. 7,8,8,7; got {value!r}") from None
        if any(not 0 < v <= field.maximum for v in out):
            raise SpecError(f"{name}: every entry must be at least 1, got {value!r}")
        return out
    if field.kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value) or not field.minimum <= value <= field.maximum:
            raise SpecError(f"{name} must be a number from {field.minimum:g} to {field.maximum:g}, got {value:g}")
        return float(value)
    value = str(value).strip() if field.keep_case else str(value).strip().lower()
    if field.choices and value not in field.choices:
        raise SpecError(f"{name} must be one of {', '.join(field.choices)}; got {value!r}")
    return value


def _stragglers(value: Any) -> tuple[tuple[int, float], ...]:
    """RANK:FACTOR items (a list, or one comma-separated string) as sorted (rank, factor) pairs."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise SpecError(f"straggler must be RANK:FACTOR items, e.g. 5:1.3; got {value!r}")
    out: dict[int, float] = {}
    for item in items:
        parts = item if isinstance(item, (list, tuple)) else str(item).split(":")
        try:
            rank, factor = int(str(parts[0]).strip()), float(str(parts[1]).strip())
            if len(parts) != 2:
                raise ValueError
        except (ValueError, IndexError):
            raise SpecError(f"straggler {item!r} must be RANK:FACTOR, "
                            "e.g. 5:1.3 (rank 5 computes 1.3x slower)") from None
        if rank < 0 or not 0 < factor <= MAX_STRAGGLER_FACTOR:
            raise SpecError(f"straggler {item!r}: the rank must be >= 0 and the factor a positive number up to {MAX_STRAGGLER_FACTOR:g}, e.g. 5:1.3")
        if rank in out:
            raise SpecError(f"straggler names rank {rank} twice: give one factor per rank")
        out[rank] = factor
    return tuple(sorted(out.items()))


def _check_keys(source: str, data: Mapping[str, Any]) -> None:
    for key in data:
        if key not in FIELD_BY_NAME and key != "preset":
            close = difflib.get_close_matches(str(key).replace("-", "_"), list(FIELD_BY_NAME), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(FIELD_BY_NAME)}"
            raise SpecError(f"{source}: unknown key {key!r}{hint}")


def normalize_order(order: str) -> str:
    order = ORDER_ALIASES.get(order.strip().lower(), order.strip().lower())
    dims = order.split("-")
    for dim in dims:
        if dim not in KNOWN_DIMS:
            raise SpecError(f"order {order!r}: unknown dimension {dim!r}; use dimensions from {'-'.join(KNOWN_DIMS)} innermost first, or 'megatron'")
    if len(set(dims)) != len(dims):
        raise SpecError(f"order {order!r} names a dimension twice; name each of tp, pp, dp once")
    missing = [d for d in REQUIRED_DIMS if d not in dims]
    if missing:
        raise SpecError(f"order {order!r} lacks {', '.join(missing)}; it must name tp, pp and dp, e.g. tp-pp-dp")
    return order


def build_spec(
    preset: str | None = None,
    config: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Spec:
    """Merge preset < config < overrides into a validated Spec."""
    return spec_builder(preset, config, overrides)({})


def spec_builder(
    preset: str | None = None,
    config: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Callable[..., Spec]:
    """build_spec for many sets of further overrides over one base (the planner's candidates):
    the base is merged and coerced once; each call validates base + its values exactly as
    build_spec(preset, config, {**overrides, **values}) would. ``reads``, when given, collects
    every key the validation looked up: a refusal that read none of some keys holds for every
    value of them (the planner skips such subtrees without trying each)."""
    from traceforge.presets import get_preset

    config = dict(config or {})
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    _check_keys("config file", config)
    _check_keys("flags", overrides)
    preset_name = preset if preset is not None else config.pop("preset", None)
    config.pop("preset", None)
    if preset_name is None:
        preset_name = "demo"
    if not isinstance(preset_name, str) or not preset_name.strip():
        raise SpecError(f"preset must be a preset's name such as llama3-8b (see 'traceforge presets'), got {preset_name!r}")
    base = get_preset(preset_name)

    explicit: dict[str, Any] = {}
    for layer in (config, overrides):
        for key, value in layer.items():
            explicit[key] = _coerce(key, value)
    preset_raw = {k: _coerce(k, v) for k, v in base.items()}

    def build(values: Mapping[str, Any], reads: set[str] | None = None) -> Spec:
        given = {k: v for k, v in values.items() if v is not None}
        _check_keys("flags", given)
        merged = {**explicit, **{k: _coerce(k, v) for k, v in given.items()}}
        raw = dict(preset_raw)
        # A value the preset derived from another (ffn_hidden = 4h, kv_heads = heads) follows that
        # other value when it is given and the derived one is not, as --help promises.
        for derived, source in DERIVED_DEFAULTS.items():
            if source in merged and derived not in merged:
                raw[derived] = None
        raw.update(merged)
        if reads is not None:
            return _normalize(_Reads(raw, reads), _Reads(merged, reads), preset_name)
        return _normalize(raw, merged, preset_name)

    return build


class _Reads(dict):
    """A mapping that notes every key looked up in it (spec_builder's ``reads``)."""

    def __init__(self, data: Mapping[str, Any], seen: set[str]):
        super().__init__(data)
        self.seen = seen

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.seen.add(key)  # type: ignore[arg-type]
        return super().__contains__(key)


# Defaults computed from another field (see _model): derived -> the field it follows.
DERIVED_DEFAULTS = {"ffn_hidden": "hidden", "kv_heads": "heads", "max_position_embeddings": "seq_len"}


def preset_values(spec: Spec, explicit: Mapping[str, Any]) -> dict[str, Any]:
    """The spec values that came from its preset: the preset's keys not given explicitly and
    not derived from an explicit value."""
    from traceforge.presets import get_preset

    given = {k for k, v in explicit.items() if v is not None}
    followed = {d for d, src in DERIVED_DEFAULTS.items() if src in given}
    doc = spec.to_dict()
    return {k: doc[k] for k in get_preset(spec.preset) if k in doc and k not in given and k not in followed}


class _Raw:
    """The merged raw values, with 'need' for required ones."""

    def __init__(self, raw: dict[str, Any], explicit: Mapping[str, Any]):
        self.raw, self.explicit = raw, explicit

    def get(self, name: str, default: Any = None) -> Any:
        value = self.raw.get(name)
        return default if value is None else value

    def need(self, name: str) -> Any:
        if self.raw.get(name) is None:
            raise SpecError(f"{name} is not set: give --{name.replace('_', '-')} or set it in the config file")
        return self.raw[name]


def _normalize(raw_values: dict[str, Any], explicit: Mapping[str, Any], preset_name: str) -> Spec:
    r = _Raw(raw_values, explicit)
    values: dict[str, Any] = {"preset": preset_name}
    for section in (_model, _parallel, _batch, _experts, _modes, _routing, _variation, _gpu, _engine):
        values.update(section(r, values))
    return Spec(**values)


def _model(r: _Raw, _: dict) -> dict:
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
    ffn_hidden = r.get("ffn_hidden", 4 * hidden)
    positions = r.get("max_position_embeddings", seq_len)
    if positions < seq_len:
        raise SpecError(f"max_position_embeddings ({positions}) must be at least seq_len ({seq_len}): "
                        "every token of a sequence looks up its position")
    return dict(arch=arch, layers=layers, hidden=hidden, ffn_hidden=ffn_hidden, heads=heads,
                kv_heads=kv_heads, head_dim=head_dim, **mla, vocab=vocab, seq_len=seq_len,
                max_position_embeddings=positions,
                tied_embeddings=r.get("tied_embeddings", arch == "gpt"))


def _parallel(r: _Raw, v: dict) -> dict:
    tp, pp, cp, ep = r.need("tp"), r.need("pp"), r.get("cp", 1), r.get("ep", 1)
    model_parallel = tp * cp * pp
    # dp: derived from world_size unless dp itself is given at least as explicitly.
    world = r.get("world_size")
    if world is not None and "world_size" in r.explicit and "dp" not in r.explicit:
        if world % model_parallel:
            raise SpecError(f"world_size {world} is not divisible by tp*cp*pp = {model_parallel}: pick a multiple of {model_parallel}")
        dp = world // model_parallel
    else:
        dp = r.need("dp")
    if world is None:
        world = model_parallel * dp
    if world != model_parallel * dp:
        raise SpecError(f"world_size {world} != tp*cp*pp*dp = {model_parallel * dp}: drop --dp to derive it, or fix one of them")
    if world > MAX_WORLD_SIZE:
        raise SpecError(f"world_size {world:,} (tp*cp*pp*dp) is above the {MAX_WORLD_SIZE:,} ranks traceforge plans: lower a size")
    heads, kv_heads = v["heads"], v["kv_heads"]
    if heads % tp:
        raise SpecError(f"heads ({heads}) must be divisible by tp ({tp}): choose tp from {_divisors(heads)}")
    if kv_heads % tp:
        raise SpecError(f"kv_heads ({kv_heads}) must be divisible by tp ({tp}), as Megatron requires: choose tp from {_divisors(kv_heads)}")
    if v["ffn_hidden"] % tp:
        raise SpecError(f"ffn_hidden ({v['ffn_hidden']}) must be divisible by tp ({tp})")
    # The embedding and the loss, accounted as layers, may each fill a stage (Megatron builds one
    # with no transformer layer); otherwise every stage needs a layer.
    accounted = bool(r.get("account_for_embedding_in_pipeline_split")) + bool(r.get("account_for_loss_in_pipeline_split"))
    if v["layers"] + accounted < pp:
        raise SpecError(f"layers ({v['layers']}) must be at least pp ({pp}){' minus the embedding/loss accounted' if accounted else ''}: "
                        "every pipeline stage needs a layer; lower --pp")
    if cp > 1 and v["seq_len"] % (2 * cp):
        raise SpecError(f"seq_len ({v['seq_len']}) must be divisible by 2*cp ({2 * cp}): context parallelism splits it into 2*cp chunks")
    order = complete_order(normalize_order(r.need("order")), cp, ep)
    dims = order.split("-")
    if ep > 1:
        if (dp * cp) % ep:
            raise SpecError(f"ep ({ep}) must divide dp*cp ({dp * cp}): experts are spread over data-parallel ranks")
        block = [d for d in dims if d in ("cp", "ep", "dp")]
        first = dims.index(block[0])
        if dims[first:first + len(block)] != block or abs(dims.index("ep") - dims.index("dp")) != 1:
            raise SpecError(f"order {order!r}: ep must sit next to dp (and cp next to them), as Megatron requires, e.g. tp-cp-ep-dp-pp")
    unchecked = bool(r.get("order_unchecked"))
    if pp > 1 and dims[-1] != "pp" and ep != cp and not unchecked:
        # Megatron builds a second (expert) rank grid with cp folded into its data-parallel
        # dimension and asserts that either pp is outermost or both grids have the same DP size
        # (core/parallel_state.py, initialize_model_parallel): ep must equal cp.
        raise SpecError(f"order {order!r} puts {dims[-1]} outside pp with cp = {cp} and ep = {ep}: Megatron refuses it "
                        "unless pp is outermost or ep = cp (parallel_state.py); use --order megatron, or "
                        "--order-unchecked to plan it anyway")
    cp_comm = r.get("cp_comm_type", "p2p")
    if cp_comm != "p2p" and cp == 1:
        raise SpecError(f"cp_comm_type {cp_comm} needs context parallelism: give --cp 2 or more, "
                        "or drop --cp-comm-type")
    if cp_comm == "a2a" and (heads // tp % cp or kv_heads // tp % cp):
        # TransformerEngine's AttnFuncWithCPAndQKVOA2A scatters heads over the CP group.
        raise SpecError(f"cp_comm_type a2a splits each TP rank's heads over cp: heads/tp ({heads // tp}) and "
                        f"kv_heads/tp ({kv_heads // tp}) must be divisible by cp ({cp}); use p2p or all-gather, or a smaller cp")
    return dict(tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, world_size=world, order=order, order_unchecked=unchecked,
                cp_comm_type=cp_comm)


def complete_order(order: str, cp: int, ep: int) -> str:
    """Insert a missing cp (right after tp) or ep (right before dp) of size > 1 where Megatron's
    default order tp-cp-ep-dp-pp has them; a missing dimension of size 1 needs no place."""
    dims = order.split("-")
    if cp > 1 and "cp" not in dims:
        dims.insert(dims.index("tp") + 1, "cp")
    if ep > 1 and "ep" not in dims:
        dims.insert(dims.index("dp"), "ep")
    return "-".join(dims)


def requested_order(preset: str | None, config: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> str:
    """The order string as given (flag > config file > preset), before missing dimensions are inserted."""
    from traceforge.presets import get_preset

    config = dict(config or {})
    given = overrides.get("order") or config.get("order")
    if given is None:
        given = get_preset(preset or config.get("preset") or "demo").get("order", "")
    return normalize_order(str(given))


def _batch(r: _Raw, v: dict) -> dict:
    dp, micro_batch = v["dp"], r.need("micro_batch")
    gb, m = r.get("global_batch"), r.get("num_microbatches")
    if "num_microbatches" in r.explicit and "global_batch" not in r.explicit:
        gb = m * micro_batch * dp
    elif gb is not None:
        if gb % (micro_batch * dp):
            raise SpecError(
                f"global_batch ({gb}) must be divisible by micro_batch*dp = {micro_batch}*{dp} = {micro_batch * dp}: "
                f"use a multiple of {micro_batch * dp}, or give --num-microbatches"
            )
        m_from_gb = gb // (micro_batch * dp)
        if m is not None and "num_microbatches" in r.explicit and m != m_from_gb:
            raise SpecError(f"num_microbatches ({m}) disagrees with global_batch/(micro_batch*dp) = {m_from_gb}: give only one of them")
        m = m_from_gb
    elif m is not None:
        gb = m * micro_batch * dp
    else:
        raise SpecError("neither global_batch nor num_microbatches is set: give --global-batch or --num-microbatches")
    tp, seq_len = v["tp"], v["seq_len"]
    sp = bool(r.get("sequence_parallel"))
    if sp and tp == 1 and "sequence_parallel" not in r.explicit:
        sp = False  # a preset's sequence parallelism goes with its TP: --tp 1 turns it off
    if sp and tp == 1:
        raise SpecError("sequence_parallel needs tp > 1 (it shards activations across the TP group): raise --tp or drop --sequence-parallel")
    if sp and (seq_len // v["cp"]) % tp:
        raise SpecError(f"seq_len/cp ({seq_len // v['cp']}) must be divisible by tp ({tp}) with sequence parallelism")
    return dict(micro_batch=micro_batch, global_batch=gb, num_microbatches=m, dtype=r.need("dtype"),
                grad_dtype=r.get("grad_dtype", "fp32"), sequence_parallel=sp, recompute=r.get("recompute", "none"))


def _experts(r: _Raw, v: dict) -> dict:
    experts, top_k, freq = r.get("experts", 0), r.get("top_k", 2), r.get("moe_layer_freq", 1)
    fine = dict(moe_first_dense_layers=r.get("moe_first_dense_layers", 0), moe_ffn_hidden=r.get("moe_ffn_hidden", v["ffn_hidden"]),
                shared_experts=r.get("shared_experts", 0), moe_router_num_groups=r.get("moe_router_num_groups", 1))
    fine["moe_router_group_topk"] = r.get("moe_router_group_topk", fine["moe_router_num_groups"])
    if experts:
        if fine["moe_ffn_hidden"] % v["tp"]:
            raise SpecError(f"moe_ffn_hidden ({fine['moe_ffn_hidden']}) must be divisible by tp ({v['tp']}): experts are tensor-parallel too")
        if fine["moe_first_dense_layers"] >= v["layers"]:
            raise SpecError(f"moe_first_dense_layers ({fine['moe_first_dense_layers']}) leaves no MoE layer of {v['layers']}: lower it")
        groups, group_topk = fine["moe_router_num_groups"], fine["moe_router_group_topk"]
        if experts % groups:
            raise SpecError(f"moe_router_num_groups ({groups}) must divide experts ({experts}): each group is experts/groups experts")
        if group_topk > groups:
            raise SpecError(f"moe_router_group_topk ({group_topk}) must be at most moe_router_num_groups ({groups})")
        if experts % v["ep"]:
            raise SpecError(f"experts ({experts}) must be divisible by ep ({v['ep']})")
        if not 1 <= top_k <= experts:
            raise SpecError(f"top_k ({top_k}) must be between 1 and experts ({experts})")
        if v["tp"] > 1 and not v["sequence_parallel"]:
            raise SpecError("MoE with tp > 1 needs --sequence-parallel (Megatron's token dispatcher expects sequence-sharded tokens)")
    elif v["ep"] > 1:
        raise SpecError(f"ep ({v['ep']}) needs a mixture-of-experts model: give --experts E")
    else:  # a dense model: routing settings other than their dense values mean a forgotten --experts
        for name, dense in (("top_k", 0), ("moe_layer_freq", 1), ("moe_first_dense_layers", 0), ("shared_experts", 0),
                            ("moe_router_num_groups", 1), ("moe_ffn_hidden", v["ffn_hidden"])):
            if r.explicit.get(name, dense) != dense:
                raise SpecError(f"{name} applies to mixture-of-experts models: give --experts E, or drop it")
        fine = dict(moe_first_dense_layers=0, moe_ffn_hidden=v["ffn_hidden"], shared_experts=0,
                    moe_router_num_groups=1, moe_router_group_topk=1)
    return dict(experts=experts, top_k=top_k if experts else 0, moe_layer_freq=freq if experts else 1, **fine)


def _modes(r: _Raw, v: dict) -> dict:
    dp, pp, m, layers = v["dp"], v["pp"], v["num_microbatches"], v["layers"]
    # The schedule is checked before the data-parallel mode: none of its rules reads the mode, so
    # the planner, which varies the mode innermost, refuses a schedule once for all modes.
    schedule = r.need("schedule")
    vs = _virtual_stages(r, schedule, pp, m)
    split = _layer_split(r, layers, pp, vs, schedule)
    steps = r.need("steps")
    nodes = estimated_nodes_per_rank(v, _most_layers_per_stage(split, layers, pp, schedule), vs, steps,
                                     r.get("recompute", "none"))
    if nodes > MAX_NODES_PER_RANK:
        raise SpecError(f"up to {nodes:,} nodes per rank (layers {layers}, pp {pp}, {m} micro-batches, {steps} steps) is above "
                        f"the {MAX_NODES_PER_RANK:,} traceforge plans: lower --layers, --num-microbatches or --steps")
    # p2p tags: pipeline transfers number steps*v*m*2, context-parallel ones steps*m*L*cp*4.
    if max(steps * m * vs * 2, steps * m * layers * v["cp"] * 4) >= MAX_TAG:
        raise SpecError(f"steps ({steps}) x micro-batches ({m}) x layers ({layers}) x cp ({v['cp']}) make too many p2p transfers "
                        f"for tags below {MAX_TAG:,}: emit fewer steps or micro-batches")
    dp_mode = DP_MODE_ALIASES.get(r.need("dp_mode"), r.need("dp_mode"))
    shard_size = r.get("shard_size")
    if dp_mode == "hsdp":
        if shard_size is None:
            raise SpecError("dp_mode hsdp needs --shard-size K: the DP ranks that shard parameters among themselves")
        if dp % shard_size:
            raise SpecError(f"shard_size ({shard_size}) must divide dp ({dp}): choose from {_divisors(dp)}")
    elif shard_size is not None:
        raise SpecError("shard_size applies only to --dp-mode hsdp: drop --shard-size or use hsdp")
    if dp_mode in ("zero3", "hsdp") and r.get("bucket_mb") is not None and "bucket_mb" in r.explicit:
        raise SpecError(f"bucket_mb does not apply to {dp_mode}, which reduces each layer's gradients on its own: drop it")
    if v["experts"] and dp_mode in ("zero3", "hsdp"):
        raise SpecError(f"dp_mode {dp_mode} with experts is not modelled: use ddp, zero1, zero2 or dist-opt")
    if v["cp"] > 1 and dp_mode == "hsdp":
        raise SpecError("dp_mode hsdp with cp > 1 is not modelled: use zero3 or a Megatron mode")
    overlap_grad = bool(r.get("overlap_grad_reduce"))
    overlap_param = bool(r.get("overlap_param_gather"))
    if overlap_grad and dp_mode not in ("ddp", *SHARDED_OPTIMIZER_MODES):
        raise SpecError(f"overlap_grad_reduce applies to ddp, zero1, zero2 and dist-opt; {dp_mode} already reduces per layer")
    if overlap_param and dp_mode not in SHARDED_OPTIMIZER_MODES:
        raise SpecError("overlap_param_gather needs a sharded optimizer: use --dp-mode dist-opt, zero1 or zero2")
    if overlap_param and not overlap_grad:
        raise SpecError("overlap_param_gather needs --overlap-grad-reduce too, as Megatron requires")
    return dict(schedule=schedule, virtual_stages=vs, **split, overlap_p2p_comm=bool(r.get("overlap_p2p_comm")),
                dp_mode=dp_mode,
                shard_size=shard_size, bucket_mb=r.get("bucket_mb"), overlap_grad_reduce=overlap_grad,
                overlap_param_gather=overlap_param, steps=steps,
                sync_collectives=bool(r.get("sync_collectives", True)),
                attention_mask_in_dataloader=bool(r.get("attention_mask_in_dataloader", True)))


def _most_layers_per_stage(split: Mapping[str, Any], layers: int, pp: int, schedule: str) -> int:
    """An upper bound on the layers one stage holds (all its model chunks), for the node estimate."""
    if split["layers_per_stage"]:
        return max(split["layers_per_stage"])
    first, last = split["decoder_first_pipeline_num_layers"], split["decoder_last_pipeline_num_layers"]
    even = -(-layers // pp) + 2  # the embedding/loss accounting moves at most one layer each
    chunks = 2 if schedule in ("zbv", "dualpipev") else 1  # a V stage holds two virtual stages
    return chunks * max(even, first or 0, last or 0)


def _virtual_stages(r: _Raw, schedule: str, pp: int, m: int) -> int:
    """Model chunks per stage, with the rules of the framework each schedule comes from."""
    vs = r.get("virtual_stages", 1)
    if schedule in ("zbv", "dualpipev") and "virtual_stages" not in r.explicit:
        vs = 2  # the V's two chunks, whatever a preset says
    if schedule == "interleaved":
        if vs < 2:
            raise SpecError("schedule interleaved needs --virtual-stages V with V >= 2 model chunks per stage")
        if pp < 3:
            raise SpecError("schedule interleaved needs pp > 2, as Megatron requires (without its p2p overlap)")
        if m % pp:
            raise SpecError(f"interleaved schedule: num_microbatches ({m}) must be divisible by pp ({pp}), "
                            "as Megatron requires")
    elif schedule == "interleaved-zb":
        if vs < 2:
            raise SpecError("schedule interleaved-zb needs --virtual-stages V with V >= 2 "
                            "(use zb-h1 for one chunk per stage)")
    elif schedule in ("zbv", "dualpipev"):
        if vs != 2:
            raise SpecError(f"schedule {schedule} places exactly 2 model chunks per stage (a V): "
                            "drop --virtual-stages")
    elif vs != 1:
        raise SpecError(f"virtual_stages ({vs}) needs --schedule interleaved or interleaved-zb")
    if schedule in ("zb-h1", "interleaved-zb") and m % max(1, m // pp):
        raise SpecError(f"schedule {schedule}: num_microbatches ({m}) must be a multiple of its {m // pp} rounds "
                        "(m // pp), as PyTorch's ScheduleInterleavedZeroBubble requires")
    if schedule == "dualpipev" and m < 2 * pp:
        raise SpecError(f"schedule dualpipev needs num_microbatches >= 2*pp = {2 * pp} (got {m}), "
                        "as PyTorch's ScheduleDualPipeV requires")
    if schedule != "1f1b" and schedule != "gpipe" and pp < 2:
        raise SpecError(f"schedule {schedule} needs pp >= 2 pipeline stages")
    return vs


def _layer_split(r: _Raw, layers: int, pp: int, vs: int, schedule: str) -> dict:
    """Layers per stage: --layers-per-stage, Megatron's first/last-stage counts, or its
    embedding/loss accounting (mutually exclusive, as Megatron asserts); checked so that every
    model chunk gets a whole number of layers."""
    per_stage = r.get("layers_per_stage")
    first, last = r.get("decoder_first_pipeline_num_layers"), r.get("decoder_last_pipeline_num_layers")
    emb = bool(r.get("account_for_embedding_in_pipeline_split"))
    loss = bool(r.get("account_for_loss_in_pipeline_split"))
    v_shaped = schedule in ("zbv", "dualpipev")
    chosen = [name for name, on in (("layers_per_stage", per_stage is not None),
                                    ("decoder_first/last_pipeline_num_layers", first is not None or last is not None),
                                    ("account_for_embedding/loss_in_pipeline_split", emb or loss)) if on]
    if len(chosen) > 1:
        raise SpecError(f"{' and '.join(chosen)} each set the layer split: give only one of them, as Megatron allows")
    out = dict(layers_per_stage=per_stage, decoder_first_pipeline_num_layers=first,
               decoder_last_pipeline_num_layers=last, account_for_embedding_in_pipeline_split=emb,
               account_for_loss_in_pipeline_split=loss)
    if per_stage is not None:
        if vs > 1:
            raise SpecError("layers_per_stage applies to one model chunk per stage: use --decoder-first/last-"
                            "pipeline-num-layers or --account-for-embedding/loss-in-pipeline-split")
        if len(per_stage) != pp:
            raise SpecError(f"layers_per_stage has {len(per_stage)} entries; give one per stage (pp = {pp})")
        if sum(per_stage) != layers:
            raise SpecError(f"layers_per_stage sums to {sum(per_stage)} but layers is {layers}: make them agree")
        return out
    slots = 2 * pp if v_shaped else pp  # the V schedules split over their 2p virtual stages (as DualPipeV forks do)
    what = "virtual stages" if v_shaped else "stages"
    if first is not None or last is not None:
        if pp < 2:
            raise SpecError("decoder_first/last_pipeline_num_layers need pp > 1")
        middle = layers - (first or 0) - (last or 0)
        stages_left = slots - (first is not None) - (last is not None)
        uneven = stages_left and (middle % stages_left or middle < stages_left)
        if middle < 0 or (stages_left == 0 and middle) or uneven:
            raise SpecError(f"layers ({layers}) minus the first/last-stage layers leaves {middle} for {stages_left} "
                            f"middle {what}: make it a positive multiple of them")
        per_chunk = 1 if v_shaped else vs
        middle_share = middle // stages_left if stages_left else None
        for name, n in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last),
                        ("middle stages' layers", middle_share)):
            if n is not None and n % per_chunk:
                raise SpecError(f"{name} ({n}) must be divisible by virtual_stages ({vs}): "
                                "each model chunk gets a whole share")
        return out
    total = layers + emb + loss
    chunks = slots if v_shaped else pp * vs
    if emb or loss:
        if total % chunks:
            raise SpecError(f"layers ({layers}) + embedding/loss ({emb + loss}) must be divisible by the {chunks} "
                            "model chunks (pp*virtual_stages) when accounted in the pipeline split")
        # A chunk may then hold only the embedding or the loss (Megatron asserts >= 0 layers).
        return out
    if (vs > 1 or v_shaped) and layers % chunks:
        raise SpecError(f"{schedule} schedule: layers ({layers}) must be divisible by pp*virtual_stages ({chunks}); "
                        "or set --decoder-first/last-pipeline-num-layers or "
                        "--account-for-embedding/loss-in-pipeline-split")
    return out


def moe_layer_count(layers: int, first_dense: int, freq: int) -> int:
    return sum(1 for layer in range(first_dense, layers) if layer % freq == 0)


def ep_tag_base(steps: int, m: int, layers: int, cp: int) -> int:
    """First tag of imbalanced expert traffic: past every context-parallel tag (EP peers can be
    CP peers; pipeline peers never are)."""
    return 1 + steps * m * layers * cp * 4


EP_TAG_KINDS = 9  # dispatch, probabilities, combine; their recomputation; three backward


def _routing(r: _Raw, v: dict) -> dict:
    from traceforge.plan.routing import BALANCED, load_routing_trace, parse_routing

    text, seed = r.get("moe_routing", BALANCED), r.get("seed", 0)
    kind, arg = parse_routing(text)
    if kind == BALANCED:
        return dict(moe_routing=BALANCED, seed=seed)
    if not v["experts"] or v["ep"] < 2:
        raise SpecError(f"moe_routing {text!r} needs a mixture-of-experts model with ep > 1: give --experts E --ep N, or use balanced")
    if v["moe_router_num_groups"] > 1:
        raise SpecError(f"moe_routing {text!r} with node-limited routing (moe_router_num_groups > 1) is not modelled: drop one of them")
    steps, m, layers = v["steps"], v["num_microbatches"], v["layers"]
    if kind == "trace":
        assert isinstance(arg, str)
        load_routing_trace(arg, steps, m, moe_layer_count(layers, v["moe_first_dense_layers"], v["moe_layer_freq"]), v["ep"])
    if ep_tag_base(steps, m, layers, v["cp"]) + steps * m * layers * EP_TAG_KINDS >= MAX_TAG:
        raise SpecError(f"steps ({steps}) x micro-batches ({m}) x layers make too many expert transfers "
                        f"for tags below {MAX_TAG}: emit fewer steps")
    # A trace file is recorded by its absolute path, so the manifest's spec rebuilds anywhere.
    routing = f"trace:{Path(str(arg)).resolve()}" if kind == "trace" else f"zipf:{arg:g}"
    return dict(moe_routing=routing, seed=seed)


def _variation(r: _Raw, v: dict) -> dict:
    """Per-rank compute speed: stragglers and jitter (emit/durations.py)."""
    world = v["world_size"]
    stragglers = r.get("straggler", ())
    for rank, _ in stragglers:
        if rank >= world:
            raise SpecError(f"straggler rank {rank} is outside the world of {world} ranks: "
                            f"give a rank from 0 to {world - 1}")
    return dict(straggler=stragglers, compute_jitter=r.get("compute_jitter", 0.0))


def _gpu(r: _Raw, v: dict) -> dict:
    from traceforge.hardware import DEFAULT_FLAT_EFFICIENCY, GPUS

    gpu = r.need("gpu")
    base = GPUS.get(gpu)
    tflops = r.get("gpu_tflops", base.peak_tflops[v["dtype"]] if base else None)
    hbm = r.get("gpu_hbm_gbps", base.hbm_gbps if base else None)
    if tflops is None or hbm is None:
        raise SpecError("gpu custom needs --gpu-tflops and --gpu-hbm-gbps")
    efficiency = r.get("gpu_efficiency", None if base and base.calibration else DEFAULT_FLAT_EFFICIENCY)
    if efficiency is not None and not 0 < efficiency <= 1:
        raise SpecError(f"gpu_efficiency must be in (0, 1], got {efficiency}")
    if tflops <= 0 or hbm <= 0:
        raise SpecError("gpu_tflops and gpu_hbm_gbps must be positive")
    return dict(gpu=gpu, gpu_tflops=float(tflops), gpu_hbm_gbps=float(hbm),
                gpu_efficiency=None if efficiency is None else float(efficiency), attention=r.get("attention", "flash"),
                bias_fusion=bool(r.get("bias_fusion", True)),
                gradient_accumulation_fusion=bool(r.get("gradient_accumulation_fusion", True)))


def _engine(r: _Raw, v: dict) -> dict:
    """Measured kernel times (read and checked now, recorded by absolute path so a manifest's spec
    rebuilds anywhere) and TransformerEngine's TP overlap and FP8 (plan/tensor.py)."""
    from traceforge.hardware import FP8
    from traceforge.kernels.times import load_kernel_times
    from traceforge.plan.tensor import overlap_tags

    path = r.get("kernel_times")
    if path is not None:
        path = str(Path(path).expanduser().resolve())
        load_kernel_times(path)
    overlap = bool(r.get("tp_comm_overlap"))
    if overlap:
        if not v["sequence_parallel"] or v["tp"] < 2:
            raise SpecError("tp_comm_overlap overlaps sequence parallelism's AllGather/ReduceScatter with the GEMMs: "
                            "give --sequence-parallel and tp > 1, or drop --tp-comm-overlap")
        if v["kv_lora_rank"]:
            raise SpecError("tp_comm_overlap with multi-head latent attention is not modelled: drop --tp-comm-overlap or --kv-lora-rank")
        if overlap_tags(v["steps"], v["num_microbatches"], v["layers"], v["tp"]) >= MAX_TAG:
            raise SpecError(f"steps ({v['steps']}) x micro-batches ({v['num_microbatches']}) x layers ({v['layers']}) x tp make too many "
                            f"TP ring transfers for tags below {MAX_TAG:,}: emit fewer steps or micro-batches")
    fp8 = r.get("fp8", "none")
    if fp8 != "none":
        if v["gpu"] not in FP8:
            raise SpecError(f"fp8 needs a GPU with FP8 tensor cores ({', '.join(FP8)}); {v['gpu']} has none: drop --fp8 or pick --gpu")
        if v["dtype"] == "fp32":
            raise SpecError("fp8 runs the GEMMs of a bf16 or fp16 model (TransformerEngine): use --dtype bf16")
    return dict(kernel_times=path, tp_comm_overlap=overlap, fp8=fp8)


def _divisors(n: int) -> str:
    return "{" + ", ".join(str(k) for k in range(1, n + 1) if n % k == 0) + "}"
