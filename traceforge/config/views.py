"""The spec's parts: the fields cut by what reads them, each part a frozen, hashable record.

The planner asks the same questions (one layer's anatomy, a stage's parameters and model states,
a layer's time floor) of hundreds of thousands of specs that differ in fields the answer does not
read, so each question is memoised on the parts it reads, and takes only those: a function that
takes a ModelConfig can read nothing but the model, so a plain functools cache keyed on its
arguments keys on exactly what it reads.

The cut follows both what the functions read and what the planner varies apart:

- model: the network's shapes (and the sequence it trains on); the search never varies it.
- sharding: how one layer's work is split over GPUs (tp, cp, ep, sequence parallelism, CP's
  exchange, TP's overlap): a layer's anatomy and costs read it, not the pipeline or the data
  parallelism.
- machine: the GPU and how its kernels run (peaks, calibration, dtypes, the attention kernel,
  fusions, FP8, measured times): what a kernel costs, and the bytes of every tensor.
- pipeline: the stages, their schedule and the layers' split.
- data: data parallelism (its size, the mode, buckets and overlaps).
- training: the step (micro-batch size and count, global batch, recomputation, routing and its
  seed, the small synchronising collectives, steps).
- trace: the written set's ranks and variation (world size, rank order, stragglers, jitter,
  the preset's name).

Parts join into the composites functions read together: Layer (model, sharding, machine: one
layer on one GPU), LayerRun (a Layer and its training: one layer's program), Staged (a Layer and
its pipeline: the model cut into stages), Placement (Staged and data: every stage's parameters,
gradients and optimizer state on its data-parallel shards). A Spec is all of them (fields.py), so
a function asking for a part accepts a whole spec; ``spec.model`` (``.layer``, ...) is the part
alone, what a memo keys on.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from traceforge.chakra.schema import ELEMENT_BYTES, TORCH_DTYPE

# Bytes per element of the spec's dtypes, from the one table of element sizes the traces carry.
DTYPE_BYTES = {name: ELEMENT_BYTES[torch_name] for name, torch_name in TORCH_DTYPE.items()}

V = TypeVar("V", bound="View")
_FIELDS: dict[type, tuple[tuple[str, ...], Callable[[dict], tuple]]] = {}


def _fields_of(cls: type) -> tuple[tuple[str, ...], Callable[[dict], tuple]]:
    """cls's field names, and a getter of their values from an instance's dict (one C call)."""
    known = _FIELDS.get(cls)
    if known is None:
        names = tuple(f.name for f in dataclasses.fields(cls))
        known = _FIELDS[cls] = names, operator.itemgetter(*names)
    return known


def field_names(cls: type) -> tuple[str, ...]:
    return _fields_of(cls)[0]


def view(cls: type[V], source: View) -> V:
    """The part cls of source (a Spec or a larger part): source itself when it is that part alone.
    A part made here holds its values as one tuple (its key, the hash of which is computed once)
    and fills its fields in only when one is read: the planner makes parts of every candidate's
    spec and reads their fields only on a memo's miss."""
    if type(source) is cls:
        return source
    values = _fields_of(cls)[1](source._fields())
    part = object.__new__(cls)  # the values come from a checked spec: nothing to check again
    d = part.__dict__
    d["_values"], d["_hash"] = values, hash((cls, values))
    return _canonical(part)


# The parts made lately, one object per value: the memos' entries of equal parts hold one object,
# and a memo's lookup with a part an earlier candidate's spec made equal finds it by identity.
_canonical: Callable[[View], Any] = functools.lru_cache(maxsize=4096)(lambda part: part)


_ALONE: set[type] = set()  # the parts' own classes (a Spec's is not one)


class Part(Generic[V]):
    """A record's part (spec.model, spec.layer, ...): made on first reading and kept in a spec's dict,
    where later readings find it (a non-data descriptor, without cached_property's lock); a part
    read from a part alone is made again (on a memo's miss only), so that a part keeps nothing
    but its values."""

    def __set_name__(self, owner: type[V], name: str) -> None:
        self.cls, self.name = owner, name
        _ALONE.add(owner)

    @overload
    def __get__(self, record: None, owner: type | None = None) -> Part[V]: ...

    @overload
    def __get__(self, record: View, owner: type | None = None) -> V: ...

    def __get__(self, record: View | None, owner: type | None = None) -> V | Part[V]:
        if record is None:
            return self
        part = view(self.cls, record)
        if type(record) not in _ALONE:
            record.__dict__[self.name] = part
        return part


class View:
    """Equal to another of its class with equal fields, its hash computed once (the memos hash
    their keys at every call); pickled as its fields alone. A part's dict holds its values and
    hash (and its fields once read): nothing the collector need follow once it has seen them, so
    the thousands of parts the memos keep cost a full collection little."""

    def _key(self) -> tuple:
        d = self.__dict__
        key = d.get("_values")
        if key is None:  # made by its __init__ (dataclasses.replace): its fields are in its dict
            key = d["_values"] = _fields_of(type(self))[1](d)
        return key  # type: ignore[no-any-return]

    def _fields(self) -> dict[str, Any]:
        """The dict holding this record's fields, filled in first if they are not yet."""
        d = self.__dict__
        if "_values" in d:
            names = _fields_of(type(self))[0]
            if names[0] not in d:  # the fields are filled in together, or not at all
                d.update(zip(names, d["_values"], strict=True))
        return d

    if not TYPE_CHECKING:  # (to mypy every attribute must be a field or a method: no fallback)
        def __getattr__(self, name: str) -> Any:
            """A field of a part made by view(), filled in on its first reading."""
            d = self.__dict__
            if "_values" in d and name in _fields_of(type(self))[0] and name not in d:
                return self._fields()[name]
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, View)
        return self._key() == other._key()

    def __hash__(self) -> int:
        d = self.__dict__
        try:
            return d["_hash"]  # type: ignore[no-any-return]
        except KeyError:
            h = d["_hash"] = hash((type(self), self._key()))
            return h

    def __getstate__(self) -> dict[str, Any]:
        d = self._fields()
        return {name: d[name] for name in field_names(type(self))}


@dataclass(frozen=True, eq=False)
class ModelConfig(View):
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
    qk_norm: bool
    experts: int
    top_k: int
    moe_layer_freq: int
    moe_first_dense_layers: int
    moe_ffn_hidden: int
    shared_experts: int
    moe_router_num_groups: int
    moe_router_group_topk: int

    model = Part["ModelConfig"]()

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3) instead of standard (GQA) attention."""
        return self.kv_lora_rank > 0


@dataclass(frozen=True, eq=False)
class ShardingConfig(View):
    tp: int
    cp: int
    ep: int
    sequence_parallel: bool
    cp_comm_type: str
    tp_comm_overlap: bool

    sharding = Part["ShardingConfig"]()


@dataclass(frozen=True, eq=False)
class MachineConfig(View):
    gpu: str
    gpu_tflops: float
    gpu_hbm_gbps: float
    gpu_efficiency: float | None  # None: the preset's per-kernel calibration (machine/gpus.py)
    attention: str
    bias_fusion: bool
    gradient_accumulation_fusion: bool
    # measured kernel times and FP8 (config/machine.py, normalize_engine)
    kernel_times: str | None
    fp8: str
    dtype: str
    grad_dtype: str

    machine = Part["MachineConfig"]()

    @property
    def act_bytes(self) -> int:
        """Bytes per activation/parameter element (e)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element as reduced (g)."""
        return DTYPE_BYTES[self.grad_dtype]


@dataclass(frozen=True, eq=False)
class PipelineConfig(View):
    pp: int
    schedule: str
    virtual_stages: int
    layers_per_stage: tuple[int, ...] | None
    decoder_first_pipeline_num_layers: int | None
    decoder_last_pipeline_num_layers: int | None
    account_for_embedding_in_pipeline_split: bool
    account_for_loss_in_pipeline_split: bool
    overlap_p2p_comm: bool
    pipeline_scatter_gather: str  # "off", "megatron" or "deepspeed" (program/stage.py)

    pipeline = Part["PipelineConfig"]()


@dataclass(frozen=True, eq=False)
class DataParallelConfig(View):
    dp: int
    dp_mode: str
    shard_size: int | None
    bucket_mb: float | None
    overlap_grad_reduce: bool
    overlap_param_gather: bool

    data = Part["DataParallelConfig"]()


@dataclass(frozen=True, eq=False)
class TrainingConfig(View):
    micro_batch: int
    global_batch: int
    num_microbatches: int
    recompute: str
    steps: int
    moe_routing: str
    seed: int
    sync_collectives: bool
    attention_mask_in_dataloader: bool

    training = Part["TrainingConfig"]()


@dataclass(frozen=True, eq=False)
class TraceConfig(View):
    world_size: int
    order: str
    order_unchecked: bool
    straggler: tuple[tuple[int, float], ...]
    compute_jitter: float
    preset: str

    trace = Part["TraceConfig"]()

    @property
    def order_dims(self) -> tuple[str, ...]:
        return tuple(self.order.split("-"))


@dataclass(frozen=True, eq=False)
class Layer(ModelConfig, ShardingConfig, MachineConfig):
    """One layer on one GPU, without its batch: its shapes, how it is split, its kernels."""

    layer = Part["Layer"]()

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


@dataclass(frozen=True, eq=False)
class LayerRun(Layer, TrainingConfig):
    """One layer's program over the step: a Layer with its batch, recomputation, routing, steps."""

    run = Part["LayerRun"]()


@dataclass(frozen=True, eq=False)
class Staged(Layer, PipelineConfig):
    """The model cut into pipeline stages: a Layer with its pipeline."""

    staged = Part["Staged"]()


@dataclass(frozen=True, eq=False)
class Placement(Staged, DataParallelConfig):
    """Every stage's parameters, gradients and optimizer state on its data-parallel shards."""

    placement = Part["Placement"]()


PARTS: tuple[type[View], ...] = (ModelConfig, ShardingConfig, MachineConfig, PipelineConfig, DataParallelConfig,
                                 TrainingConfig, TraceConfig)
