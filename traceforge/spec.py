"""The training spec: one validated, immutable description of model, layout and step.

A spec is assembled from three layers, later ones winning: a preset (default ``demo``), an
optional config file (YAML, TOML or JSON; flat keys named like the CLI flags in snake_case),
and CLI flags. ``build_spec`` merges them, fills every default explicitly and refuses every
impossible combination with one line naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from traceforge.errors import SpecError

MEGATRON_ORDER = "tp-cp-ep-dp-pp"
ORDER_ALIASES = {"megatron": MEGATRON_ORDER}
KNOWN_DIMS = ("tp", "cp", "ep", "dp", "pp")
REQUIRED_DIMS = ("tp", "pp", "dp")

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DP_MODE_ALIASES = {"fsdp": "zero3"}
SHARDED_OPTIMIZER_MODES = ("zero1", "zero2", "dist-opt")

# ASTRA-sim keeps p2p tags below this; our tags grow with steps x micro-batches.
MAX_TAG = 500_000_000


@dataclass(frozen=True)
class Field:
    """One spec key: its type, help line (shared by --help and the docs) and allowed values."""

    name: str
    kind: type
    help: str
    choices: tuple[str, ...] = ()
    # Flag spelling for booleans: (on, off).
    bool_flags: tuple[str, str] | None = None


FIELDS: tuple[Field, ...] = (
    # model
    Field("arch", str, "Model family: gpt (biases, GELU MLP, learned positions) or llama (GQA, SwiGLU, no biases).", ("gpt", "llama")),
    Field("layers", int, "Transformer layers."),
    Field("hidden", int, "Hidden size h."),
    Field("ffn_hidden", int, "MLP inner size f (default 4h)."),
    Field("heads", int, "Attention heads."),
    Field("kv_heads", int, "Key/value heads (GQA query groups; default = heads)."),
    Field("vocab", int, "Vocabulary size (padded to a multiple of 128*tp, as Megatron does)."),
    Field("seq_len", int, "Sequence length s in tokens."),
    Field("tied_embeddings", bool, "Share input embedding and LM head weights (default: gpt yes, llama no).",
          bool_flags=("--tied-embeddings", "--untied-embeddings")),
    # parallelism
    Field("tp", int, "Tensor-parallel size t."),
    Field("pp", int, "Pipeline-parallel size p (stages)."),
    Field("dp", int, "Data-parallel size d (derived from --world-size when that is given)."),
    Field("world_size", int, "Total GPUs; must equal tp*pp*dp (give it instead of --dp to derive dp)."),
    Field("order", str, "Rank order, innermost dimension first, e.g. tp-pp-dp (default) or megatron (= tp-cp-ep-dp-pp)."),
    # training step
    Field("micro_batch", int, "Micro-batch size b in sequences."),
    Field("global_batch", int, "Global batch in sequences; micro-batches per step m = global_batch / (b*dp)."),
    Field("num_microbatches", int, "Micro-batches per step m (instead of --global-batch)."),
    Field("dtype", str, "Parameter/activation dtype.", ("bf16", "fp16", "fp32")),
    Field("grad_dtype", str, "Gradient dtype as reduced (default fp32, as Megatron's main grads).", ("bf16", "fp16", "fp32")),
    Field("sequence_parallel", bool, "Megatron sequence parallelism: TP AllGather/ReduceScatter instead of AllReduce.",
          bool_flags=("--sequence-parallel", "--no-sequence-parallel")),
    Field("recompute", str, "Activation recomputation: full replays each layer's forward (and its TP collectives) in backward; selective only attention's core.",
          ("none", "selective", "full")),
    Field("schedule", str, "Pipeline schedule.", ("1f1b", "gpipe", "interleaved")),
    Field("virtual_stages", int, "Model chunks per stage for --schedule interleaved (Megatron's virtual pipeline size)."),
    Field("layers_per_stage", list, "Layers on each stage, comma-separated (e.g. 7,8,...,8,7); default: even, shortfall from the outer stages."),
    Field("dp_mode", str, "Data-parallel mode: ddp, zero1, zero2, dist-opt (Megatron distributed optimizer), zero3 (fsdp), hsdp (FSDP HYBRID_SHARD).",
          ("ddp", "zero1", "zero2", "dist-opt", "zero3", "fsdp", "hsdp")),
    Field("shard_size", int, "hsdp: shard parameters within groups of this many DP ranks, replicate across them."),
    Field("bucket_mb", float, "Gradient bucket size in MiB (default: Megatron's max(4e7, 1e6*dp) elements; 0 = one bucket)."),
    Field("overlap_grad_reduce", bool, "Issue each gradient bucket as soon as the last micro-batch's backward has produced it.",
          bool_flags=("--overlap-grad-reduce", "--no-overlap-grad-reduce")),
    Field("overlap_param_gather", bool, "Sharded optimizers: overlap the parameter AllGather with the next forward.",
          bool_flags=("--overlap-param-gather", "--no-overlap-param-gather")),
    Field("steps", int, "Training steps to emit."),
    Field("gpu", str, "GPU model for compute durations (custom: give --gpu-tflops and --gpu-hbm-gbps).",
          ("h100", "h200", "a100", "b200", "custom")),
    Field("gpu_tflops", float, "Dense peak TFLOP/s in --dtype (default: the GPU's datasheet figure)."),
    Field("gpu_hbm_gbps", float, "HBM bandwidth in GB/s (default: the GPU's datasheet figure)."),
    Field("gpu_efficiency", float, "Fraction of peak FLOP/s and bandwidth achieved (default 0.5)."),
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
    vocab: int
    seq_len: int
    tied_embeddings: bool
    tp: int
    pp: int
    dp: int
    world_size: int
    order: str
    micro_batch: int
    global_batch: int
    num_microbatches: int
    dtype: str
    grad_dtype: str
    sequence_parallel: bool
    recompute: str
    schedule: str
    virtual_stages: int
    layers_per_stage: tuple[int, ...] | None
    dp_mode: str
    shard_size: int | None
    bucket_mb: float | None
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    steps: int
    gpu: str
    gpu_tflops: float
    gpu_hbm_gbps: float
    gpu_efficiency: float
    preset: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def act_bytes(self) -> int:
        """Bytes per activation/parameter element (e)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element as reduced (g)."""
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def order_dims(self) -> tuple[str, ...]:
        return tuple(self.order.split("-"))


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a flat spec mapping from YAML, TOML or JSON, chosen by the file's extension."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"config file {path} does not exist: give the path of a .yaml, .toml or .json spec")
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        elif suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise SpecError(f"config file {path}: unknown extension {suffix!r}; use .yaml, .yml, .toml or .json")
    except SpecError:
        raise
    except Exception as exc:  # the parsers' own error types differ; all mean malformed input
        detail = " ".join(str(exc).split())
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
        if value <= 0:
            raise SpecError(f"{name} must be a positive whole number, got {value}")
        return value
    if field.kind is list:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise SpecError(f"{name} must be a list of whole numbers, e.g. 7,8,8,7; got {value!r}")
        try:
            out = tuple(int(str(v).strip()) for v in items)
        except ValueError:
            raise SpecError(f"{name} must be a list of whole numbers, e.g. 7,8,8,7; got {value!r}") from None
        if any(v <= 0 for v in out):
            raise SpecError(f"{name}: every entry must be at least 1, got {value!r}")
        return out
    if field.kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{name} must be a number, got {value!r}")
        if value < 0 or not math.isfinite(value):
            raise SpecError(f"{name} must be a finite number >= 0, got {value}")
        return float(value)
    value = str(value).strip().lower()
    if field.choices and value not in field.choices:
        raise SpecError(f"{name} must be one of {', '.join(field.choices)}; got {value!r}")
    return value


def _check_keys(source: str, data: Mapping[str, Any]) -> None:
    for key in data:
        if key not in FIELD_BY_NAME and key != "preset":
            close = [f.name for f in FIELDS if key.replace("-", "_") == f.name]
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
    from traceforge.presets import get_preset

    config = dict(config or {})
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    _check_keys("config file", config)
    _check_keys("flags", overrides)
    preset_name = preset or config.pop("preset", None) or "demo"
    config.pop("preset", None)
    base = get_preset(preset_name)

    explicit: dict[str, Any] = {}
    for layer in (config, overrides):
        for key, value in layer.items():
            explicit[key] = _coerce(key, value)
    raw = {k: _coerce(k, v) for k, v in base.items()}
    raw.update(explicit)
    return _normalize(raw, explicit, preset_name)


def _normalize(raw: dict[str, Any], explicit: Mapping[str, Any], preset_name: str) -> Spec:
    def need(name: str) -> Any:
        if raw.get(name) is None:
            raise SpecError(f"{name} is not set: give --{name.replace('_', '-')} or set it in the config file")
        return raw[name]

    arch = need("arch")
    layers, hidden, heads, vocab, seq_len = (need(k) for k in ("layers", "hidden", "heads", "vocab", "seq_len"))
    kv_heads = raw.get("kv_heads") or heads
    ffn_hidden = raw.get("ffn_hidden") or 4 * hidden
    tied = raw.get("tied_embeddings")
    if tied is None:
        tied = arch == "gpt"
    tp, pp = need("tp"), need("pp")

    # dp: derived from world_size unless dp itself is given at least as explicitly.
    world = raw.get("world_size")
    if world is not None and ("world_size" in explicit and "dp" not in explicit):
        if world % (tp * pp):
            raise SpecError(f"world_size {world} is not divisible by tp*pp = {tp * pp}: pick a world size that is a multiple of {tp * pp}")
        dp = world // (tp * pp)
    else:
        dp = need("dp")
    if world is None:
        world = tp * pp * dp
    if world != tp * pp * dp:
        raise SpecError(f"world_size {world} != tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp}: drop --dp to derive it, or fix one of them")

    if hidden % heads:
        raise SpecError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    if heads % tp:
        raise SpecError(f"heads ({heads}) must be divisible by tp ({tp}): choose tp from {_divisors(heads)}")
    if kv_heads > heads or heads % kv_heads:
        raise SpecError(f"kv_heads ({kv_heads}) must divide heads ({heads})")
    if kv_heads % tp:
        raise SpecError(f"kv_heads ({kv_heads}) must be divisible by tp ({tp}), as Megatron requires: choose tp from {_divisors(kv_heads)}")
    if ffn_hidden % tp:
        raise SpecError(f"ffn_hidden ({ffn_hidden}) must be divisible by tp ({tp})")
    if layers < pp:
        raise SpecError(f"layers ({layers}) must be at least pp ({pp}): every pipeline stage needs a layer; lower --pp")

    order = normalize_order(need("order"))

    micro_batch = need("micro_batch")
    gb, m = raw.get("global_batch"), raw.get("num_microbatches")
    if "num_microbatches" in explicit and "global_batch" not in explicit:
        gb = m * micro_batch * dp
    elif gb is not None:
        if gb % (micro_batch * dp):
            raise SpecError(
                f"global_batch ({gb}) must be divisible by micro_batch*dp = {micro_batch}*{dp} = {micro_batch * dp}: "
                f"use a multiple of {micro_batch * dp}, or give --num-microbatches"
            )
        m_from_gb = gb // (micro_batch * dp)
        if m is not None and "num_microbatches" in explicit and m != m_from_gb:
            raise SpecError(f"num_microbatches ({m}) disagrees with global_batch/(micro_batch*dp) = {m_from_gb}: give only one of them")
        m = m_from_gb
    elif m is not None:
        gb = m * micro_batch * dp
    else:
        raise SpecError("neither global_batch nor num_microbatches is set: give --global-batch or --num-microbatches")

    dtype = need("dtype")
    grad_dtype = raw.get("grad_dtype") or "fp32"
    sp = bool(raw.get("sequence_parallel"))
    if sp and tp == 1:
        raise SpecError("sequence_parallel needs tp > 1 (it shards activations across the TP group): raise --tp or drop --sequence-parallel")
    if sp and seq_len % tp:
        raise SpecError(f"seq_len ({seq_len}) must be divisible by tp ({tp}) with sequence parallelism")
    dp_mode = DP_MODE_ALIASES.get(need("dp_mode"), raw["dp_mode"])
    shard_size = raw.get("shard_size")
    if dp_mode == "hsdp":
        if shard_size is None:
            raise SpecError("dp_mode hsdp needs --shard-size K: the DP ranks that shard parameters among themselves")
        if dp % shard_size:
            raise SpecError(f"shard_size ({shard_size}) must divide dp ({dp}): choose from {_divisors(dp)}")
    elif shard_size is not None:
        raise SpecError("shard_size applies only to --dp-mode hsdp: drop --shard-size or use hsdp")
    overlap_grad = bool(raw.get("overlap_grad_reduce"))
    overlap_param = bool(raw.get("overlap_param_gather"))
    if overlap_grad and dp_mode not in ("ddp", *SHARDED_OPTIMIZER_MODES):
        raise SpecError(f"overlap_grad_reduce applies to ddp, zero1, zero2 and dist-opt; {dp_mode} already reduces per layer")
    if overlap_param and dp_mode not in SHARDED_OPTIMIZER_MODES:
        raise SpecError("overlap_param_gather needs a sharded optimizer: use --dp-mode dist-opt, zero1 or zero2")

    schedule = need("schedule")
    v = raw.get("virtual_stages") or 1
    layers_per_stage = raw.get("layers_per_stage")
    if schedule == "interleaved":
        if v < 2:
            raise SpecError("schedule interleaved needs --virtual-stages V with V >= 2 model chunks per stage")
        if pp < 2:
            raise SpecError("schedule interleaved needs pp >= 2")
        if m % pp:
            raise SpecError(f"interleaved schedule: num_microbatches ({m}) must be divisible by pp ({pp}), as Megatron requires")
        if layers % (pp * v):
            raise SpecError(f"interleaved schedule: layers ({layers}) must be divisible by pp*virtual_stages ({pp}*{v} = {pp * v})")
        if layers_per_stage is not None:
            raise SpecError("layers_per_stage cannot be combined with the interleaved schedule: drop one of them")
    elif v != 1:
        raise SpecError(f"virtual_stages ({v}) needs --schedule interleaved")
    if layers_per_stage is not None:
        if len(layers_per_stage) != pp:
            raise SpecError(f"layers_per_stage has {len(layers_per_stage)} entries; give one per stage (pp = {pp})")
        if sum(layers_per_stage) != layers:
            raise SpecError(f"layers_per_stage sums to {sum(layers_per_stage)} but layers is {layers}: make them agree")

    from traceforge.hardware import GPUS

    gpu = need("gpu")
    base_gpu = GPUS.get(gpu)
    tflops = raw.get("gpu_tflops") or (base_gpu.peak_tflops[dtype] if base_gpu else None)
    hbm = raw.get("gpu_hbm_gbps") or (base_gpu.hbm_gbps if base_gpu else None)
    if tflops is None or hbm is None:
        raise SpecError("gpu custom needs --gpu-tflops and --gpu-hbm-gbps")
    efficiency = raw.get("gpu_efficiency") or 0.5
    if not 0 < efficiency <= 1:
        raise SpecError(f"gpu_efficiency must be in (0, 1], got {efficiency}")
    steps = need("steps")
    if steps * m * v * 2 >= MAX_TAG:
        raise SpecError(f"steps*num_microbatches ({steps}*{m}) is too large for p2p tags below {MAX_TAG}: emit fewer steps")

    return Spec(
        arch=arch, layers=layers, hidden=hidden, ffn_hidden=ffn_hidden, heads=heads, kv_heads=kv_heads,
        vocab=vocab, seq_len=seq_len, tied_embeddings=tied, tp=tp, pp=pp, dp=dp, world_size=world,
        order=order, micro_batch=micro_batch, global_batch=gb, num_microbatches=m, dtype=dtype,
        grad_dtype=grad_dtype, sequence_parallel=sp, recompute=raw.get("recompute") or "none", schedule=schedule,
        virtual_stages=v, layers_per_stage=layers_per_stage, dp_mode=dp_mode, shard_size=shard_size,
        bucket_mb=raw.get("bucket_mb"), overlap_grad_reduce=overlap_grad, overlap_param_gather=overlap_param,
        steps=steps, gpu=gpu, gpu_tflops=float(tflops), gpu_hbm_gbps=float(hbm), gpu_efficiency=float(efficiency),
        preset=preset_name,
    )


def _divisors(n: int) -> str:
    return "{" + ", ".join(str(k) for k in range(1, n + 1) if n % k == 0) + "}"
