"""Merging a spec: preset < config file < flags, each value coerced to its field's type, then
every domain's check in turn (architecture, parallelism, batch, experts, schedule, data
parallelism, routing, machine) fills the defaults and refuses impossible combinations."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

import traceforge.config.architecture as architecture
import traceforge.config.batch as batch
import traceforge.config.data_parallel as data_parallel
import traceforge.config.experts as experts
import traceforge.config.machine as machine
import traceforge.config.parallelism as parallelism
import traceforge.config.schedule as schedule
from traceforge.base.errors import SpecError, as_given
from traceforge.config.fields import FIELD_BY_NAME, Spec
from traceforge.config.limits import MAX_STRAGGLER_FACTOR
from traceforge.config.presets import canonical_preset, get_preset
from traceforge.config.raw import Raw


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
    config = dict(config or {})
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    check_keys("config file", config)
    check_keys("flags", overrides)
    preset_name = preset if preset is not None else config.pop("preset", None)
    config.pop("preset", None)
    if preset_name is None:
        preset_name = "demo"
    if not isinstance(preset_name, str) or not preset_name.strip():
        raise SpecError(f"preset must be a preset's name such as llama3-8b (see 'traceforge presets'), got {preset_name!r}")
    preset_name = canonical_preset(preset_name)  # an old name: its new one (and a note)
    base = get_preset(preset_name)

    explicit: dict[str, Any] = {}
    for layer in (config, overrides):
        for key, value in layer.items():
            explicit[key] = _coerce(key, value)
    preset_raw = {k: _coerce(k, v) for k, v in base.items()}

    def build(values: Mapping[str, Any], reads: set[str] | None = None) -> Spec:
        given = {k: v for k, v in values.items() if v is not None}
        check_keys("flags", given)
        merged = {**explicit, **{k: _coerce(k, v) for k, v in given.items()}}
        raw = dict(preset_raw)
        # A value the preset derived from another (ffn_hidden = 4h, kv_heads = heads) follows that
        # other value when it is given and the derived one is not, as --help promises.
        for derived, source in DERIVED_DEFAULTS.items():
            if source in merged and derived not in merged:
                raw[derived] = None
        # Likewise an architecture's defaults follow the architecture a spec names, not its preset's.
        if "arch" in merged:
            for name in architecture.ARCH_DEFAULTS.get(merged["arch"], {}):
                if name not in merged:
                    raw[name] = None
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


# Defaults computed from another field (see architecture.normalize): derived -> the field it follows.
DERIVED_DEFAULTS = {"ffn_hidden": "hidden", "kv_heads": "heads", "max_position_embeddings": "seq_len"}


def preset_values(spec: Spec, explicit: Mapping[str, Any]) -> dict[str, Any]:
    """The spec values that came from its preset: the preset's keys not given explicitly and
    not derived from an explicit value, nor the architecture's defaults of an architecture given."""
    given = {k for k, v in explicit.items() if v is not None}
    followed = {d for d, src in DERIVED_DEFAULTS.items() if src in given}
    if "arch" in given:
        followed |= set(architecture.ARCH_DEFAULTS.get(spec.arch, {}))
    doc = spec.to_dict()
    return {k: doc[k] for k in get_preset(spec.preset) if k in doc and k not in given and k not in followed}


def arch_values(spec: Spec, explicit: Mapping[str, Any]) -> dict[str, Any]:
    """The spec values that came from the architecture it names (given, not the preset's)."""
    given = {k for k, v in explicit.items() if v is not None}
    if "arch" not in given:
        return {}
    doc = spec.to_dict()
    return {k: doc[k] for k in architecture.ARCH_DEFAULTS.get(spec.arch, {}) if k not in given}


def spec_defaults(spec: Mapping[str, Any]) -> dict[str, str]:
    """A spec's defaults that are not its preset's values, each with where it came from (field ->
    "arch llama"); the preset the other defaults came from is the spec's ``preset``. For a spec
    read from a manifest, so anything it holds is taken as given: a spec not of ours has none."""
    name = spec.get("preset")
    try:
        preset = get_preset(name) if isinstance(name, str) else None
    except SpecError:
        preset = None
    return architecture.arch_defaults(spec, preset) if preset is not None else {}


def spec_label(spec: Mapping[str, Any]) -> str:
    """What a summary or report header calls a spec: its preset's name, or, where the spec names
    another architecture than its preset's, a custom model of that architecture over the preset's
    other defaults (`custom llama over demo`): never a Llama spec labelled as the GPT demo."""
    preset, arch = spec.get("preset"), spec.get("arch")
    try:
        base = get_preset(preset) if isinstance(preset, str) else None
    except SpecError:
        base = None
    if base is not None and isinstance(arch, str) and arch != base.get("arch"):
        return f"custom {arch} over {preset}"
    return str(preset)


# Each domain's check, in order: a later one reads the values the earlier ones settled.
SECTIONS = (architecture.normalize, parallelism.normalize, batch.normalize, experts.normalize, schedule.normalize,
            data_parallel.normalize, experts.normalize_routing, machine.normalize_variation, machine.normalize_gpu,
            machine.normalize_engine)


def _normalize(raw_values: dict[str, Any], explicit: Mapping[str, Any], preset_name: str) -> Spec:
    r = Raw(raw_values, explicit)
    values: dict[str, Any] = {"preset": preset_name}
    for section in SECTIONS:
        values.update(section(r, values))
    return Spec(**values)


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
            raise SpecError(f"{name} must be a number from {field.minimum:g} to {field.maximum:g}, got {as_given(value)}")
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


# Names users bring from Megatron-LM and elsewhere: suggested by meaning (spelling alone matched
# tensor_parallel to sequence_parallel).
KEY_ALIASES = {"tensor_parallel": "tp", "tensor_model_parallel_size": "tp", "pipeline_parallel": "pp",
               "pipeline_model_parallel_size": "pp", "data_parallel": "dp", "context_parallel": "cp",
               "context_parallel_size": "cp", "expert_parallel": "ep", "expert_model_parallel_size": "ep",
               "num_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
               "num_query_groups": "kv_heads", "ffn_hidden_size": "ffn_hidden", "seq_length": "seq_len",
               "micro_batch_size": "micro_batch", "global_batch_size": "global_batch", "num_experts": "experts",
               "moe_router_topk": "top_k", "padded_vocab_size": "vocab"}


def check_keys(source: str, data: Mapping[str, Any]) -> None:
    """Refuse a key no field has, suggesting the one meant (source names where it was given)."""
    for key in data:
        if key not in FIELD_BY_NAME and key != "preset":
            alias = KEY_ALIASES.get(str(key).replace("-", "_").lower())
            close = [alias] if alias else difflib.get_close_matches(str(key).replace("-", "_"), list(FIELD_BY_NAME), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(FIELD_BY_NAME)}"
            raise SpecError(f"{source}: unknown key {key!r}{hint}")
