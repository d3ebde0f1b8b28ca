"""The generated traffic, checked from first principles.

Every expected count and byte size below is computed here from the spec's numbers and the
formulas of docs/traffic-model.md (Megatron-LM conventions) and the README; nothing is taken
from traceforge.program or traceforge.model.params (the GPT-3 175B check reads the planner's output ops,
never its arithmetic). Where the docs are silent the Megatron/DeepSpeed source fact is named.
Notation as docs/traffic-model.md: b micro-batch, s sequence, h hidden, f FFN, V vocabulary
(padded to a multiple of 128*t), L layers, t/p/d parallel sizes,
m micro-batches, e bytes per activation/parameter element, g bytes per gradient element.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
from oracle import (
    AR,
    COLL,
    COLL_TYPES,
    COMP,
    RECV,
    SEND,
    DecodedSet,
    ancestors,
    assert_sound,
    by_step,
    collective_counter,
    collective_problems,
    collective_totals,
    consistency_problems,
    depends_on,
    group_order_problems,
    load_set,
    node_problems,
    p2p_counter,
    p2p_problems,
    peer,
    unfinished,
)

from traceforge.config import build_spec
from traceforge.write.writer import write_trace_set

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
FP32 = 4
MEGATRON_MIN_BUCKET = 40_000_000  # elements; Megatron's overlapped bucket is max(4e7, 1e6*d)

# -- the model, in our own arithmetic ---------------------------------------------------------


def ceil_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class M:
    """The spec's numbers, as docs/traffic-model.md names them."""

    arch: str
    L: int
    h: int
    f: int
    heads: int
    kv: int
    V: int
    s: int
    tied: bool
    t: int
    p: int
    d: int
    b: int
    m: int
    e: int
    g: int
    sp: bool
    schedule: str
    mode: str
    steps: int
    order: str
    v: int = 1  # model chunks per stage (interleaved schedule)
    recompute: str = "none"
    dtype: str = "bf16"
    sync: bool = True  # Megatron's small synchronising collectives
    mask: bool = True  # the attention mask travels with the batch

    @classmethod
    def of(cls, spec: dict) -> M:
        d, b = spec["dp"], spec["micro_batch"]
        assert spec["global_batch"] % (b * d) == 0
        return cls(
            arch=spec["arch"], L=spec["layers"], h=spec["hidden"], f=spec["ffn_hidden"], heads=spec["heads"],
            kv=spec["kv_heads"], V=spec["vocab"], s=spec["seq_len"], tied=spec["tied_embeddings"],
            t=spec["tp"], p=spec["pp"], d=d, b=b, m=spec["global_batch"] // (b * d), e=BYTES[spec["dtype"]],
            g=BYTES[spec["grad_dtype"]], sp=spec["sequence_parallel"], schedule=spec["schedule"],
            mode={"fsdp": "zero3"}.get(spec["dp_mode"], spec["dp_mode"]), steps=spec["steps"],
            order=spec["order"], v=spec.get("virtual_stages") or 1, recompute=spec.get("recompute") or "none",
            dtype=spec["dtype"], sync=spec.get("sync_collectives", True), mask=spec.get("attention_mask_in_dataloader", True),
        )

    @property
    def sizes(self) -> dict[str, int]:
        return {"tp": self.t, "pp": self.p, "dp": self.d}

    # sizes in bytes
    @property
    def act(self) -> int:  # b*s*h*e: TP AllReduce, full TP tensor, P2P without SP
        return self.b * self.s * self.h * self.e

    @property
    def shard(self) -> int:
        return self.act // self.t

    @property
    def p2p(self) -> int:
        return self.shard if self.sp else self.act

    @property
    def xent(self) -> int:  # vocab-parallel cross-entropy: b*s fp32 values
        return self.b * self.s * FP32

    @property
    def Vp(self) -> int:
        return ceil_to(self.V, 128 * self.t)

    # parameters per TP rank
    def layer_params(self) -> int:
        h, t = self.h, self.t
        if self.arch == "gpt":
            assert self.f == 4 * h and self.kv == self.heads, "the GPT formula below assumes f = 4h, no GQA"
            assert (12 * h * h + 7 * h) % t == 0
            return (12 * h * h + 7 * h) // t + 6 * h
        kv_dim = self.kv * h // self.heads
        split = 2 * h * h + 2 * h * kv_dim + 3 * h * self.f
        assert split % t == 0
        return split // t + 2 * h

    def layer_replicated(self) -> int:
        """TP-replicated parameters of a layer: GPT 2 LayerNorms (w+b) + proj/fc2 biases; Llama 2 RMSNorms."""
        return 6 * self.h if self.arch == "gpt" else 2 * self.h

    def final_norm(self) -> int:
        return 2 * self.h if self.arch == "gpt" else self.h

    def layers_per_stage(self) -> list[int]:
        """README: ceil(L/p) per stage; a shortfall comes off the outer stages first (last, first, ...)."""
        base = -(-self.L // self.p)
        counts = [base] * self.p
        outer, lo, hi = [], 0, self.p - 1
        while lo <= hi:
            outer += [hi] if lo == hi else [hi, lo]
            lo, hi = lo + 1, hi - 1
        for stage in outer[: base * self.p - self.L]:
            counts[stage] -= 1
        return counts

    def stage_layers(self, stage: int) -> list[int]:
        """Global layer indices on a stage. Interleaved (docs/traffic-model.md: v chunks): virtual stage c*p + i
        of L/(p*v) layers is chunk c of stage i."""
        if self.v > 1:
            per = self.L // (self.p * self.v)
            return [layer for c in range(self.v) for layer in range((c * self.p + stage) * per, (c * self.p + stage + 1) * per)]
        counts = self.layers_per_stage()
        start = sum(counts[:stage])
        return list(range(start, start + counts[stage]))

    def chunk_of(self, layer: int) -> int:
        return layer // (self.L // (self.p * self.v)) // self.p if self.v > 1 else 0

    def units(self, stage: int) -> list[int]:
        """Parameters per TP rank of each unit on a stage: embedding, layers, head (in forward order)."""
        first, last = stage == 0, stage == self.p - 1
        word = self.Vp // self.t * self.h
        out = []
        if first:
            out.append(word + (self.s * self.h if self.arch == "gpt" else 0))
        out += [self.layer_params()] * len(self.stage_layers(stage))
        if last:
            # untied: the output layer; tied with p > 1: a second copy of the word embedding
            out.append((word if (not self.tied or self.p > 1) else 0) + self.final_norm())
        return out

    def stage_params(self, stage: int) -> int:
        return sum(self.units(stage))

    def backward_params(self, stage: int) -> list[tuple[int, bool]]:
        """(elements per TP rank, shared embedding) of each parameter tensor of a (single-chunk)
        stage in backward order, the reverse of Megatron's registration order (gpt_model.py:
        embedding, layers, final norm, output layer; a TE layer: linear_proj, linear_qkv with its
        norm first, linear_fc1 with its norm first, linear_fc2)."""
        h, t, gpt = self.h, self.t, self.arch == "gpt"
        kv_dim = self.kv * h // self.heads
        fc1 = h * self.f // t * (1 if gpt else 2)
        norm = [h, h] if gpt else [h]
        layer = ([h * h // t] + ([h] if gpt else []) + norm + [h * (h + 2 * kv_dim) // t] + ([(h + 2 * kv_dim) // t] if gpt else [])
                 + norm + [fc1] + ([self.f // t] if gpt else []) + [self.f * h // t] + ([h] if gpt else []))
        shared = self.tied and self.p > 1
        word = self.Vp // t * h
        forward: list[tuple[int, bool]] = []
        if stage == 0:
            forward += [(word, shared)] + ([(self.s * h, False)] if gpt else [])
        forward += [(n, False) for n in layer] * len(self.stage_layers(stage))
        if stage == self.p - 1:
            forward += [(n, False) for n in self.final_norm_tensors()]
            if not self.tied or self.p > 1:
                forward.append((word, shared))
        return forward[::-1]

    def final_norm_tensors(self) -> list[int]:
        return [self.h, self.h] if self.arch == "gpt" else [self.h]

    def chunk_params(self, stage: int) -> list[int]:
        """Parameters per TP rank of each model chunk on a stage (one chunk unless interleaved)."""
        if self.v == 1:
            return [self.stage_params(stage)]
        per = self.L // (self.p * self.v) * self.layer_params()
        first, last = self.units(0)[0], self.units(self.p - 1)[-1]  # embedding, head
        return [per + (first if (stage, c) == (0, 0) else 0) + (last if (stage, c) == (self.p - 1, self.v - 1) else 0)
                for c in range(self.v)]

    def padding(self) -> int:
        """Gradient buckets are padded only where they are sharded: a plain AllReduce needs none
        (docs/traffic-model.md: ddp AllReduce of G*g); sharded modes to a multiple of d so shards are equal;
        Megatron's distributed optimizer to lcm(d, 128) (param_and_grad_buffer)."""
        if self.mode == "ddp":
            return 1
        return math.lcm(self.d, 128) if self.mode == "dist-opt" else self.d

    # expected traffic
    def per_microbatch(self, stage: int) -> Counter:
        """(phase, dim, collective, comm_size) -> count, for one micro-batch on this stage."""
        first, last = stage == 0, stage == self.p - 1
        n = len(self.stage_layers(stage))
        replay = n if self.recompute == "full" else 0  # full recompute repeats each layer's forward in backward
        c = Counter()
        if self.t > 1:
            if not self.sp:
                c[("fwd", "tp", "ALL_REDUCE", self.act)] += 2 * n + first  # proj, fc2; embedding
                c[("bwd", "tp", "ALL_REDUCE", self.act)] += 2 * n + last + 2 * replay  # QKV, fc1 dgrad; LM head
            else:
                c[("fwd", "tp", "ALL_GATHER", self.shard)] += 2 * n + last  # before QKV, fc1; LM head input
                # The embedding reduce-scatters its output, except with learned positions (gpt):
                # Megatron AllReduces, adds the positions, then splits locally.
                positions = self.arch == "gpt"
                c[("fwd", "tp", "REDUCE_SCATTER", self.act)] += 2 * n + (first and not positions)  # proj, fc2
                c[("fwd", "tp", "ALL_REDUCE", self.act)] += first and positions
                c[("bwd", "tp", "ALL_GATHER", self.shard)] += 4 * n + first + last + 2 * replay
                c[("bwd", "tp", "REDUCE_SCATTER", self.act)] += 2 * n + last + 2 * replay
            if last:
                c[("fwd", "tp", "ALL_REDUCE", self.xent)] += 3  # max, target logit, sum-exp
            if self.sync:
                # Megatron's get_batch_on_this_tp_rank: TP rank 0 broadcasts the first stage's
                # tokens and position ids (int64), the last stage's labels (int64) and loss mask
                # (fp32), b*s each, and to both the b*s*s bool attention mask; written as
                # AllGathers in which each rank contributes ceil(N/t) bytes.
                bs = self.b * self.s
                sizes = ([8 * bs, 8 * bs] if first else []) + ([8 * bs, 4 * bs] if last else [])
                sizes += [bs * self.s] if self.mask and (first or last) else []
                for n in sizes:
                    c[("fwd", "tp", "ALL_GATHER", -(-n // self.t))] += 1
        if self.mode == "zero3" and self.d > 1:
            for unit in self.units(stage):
                padded = ceil_to(unit, self.d)
                c[("fwd", "dp", "ALL_GATHER", padded * self.e // self.d)] += 1
                c[("bwd", "dp", "ALL_GATHER", padded * self.e // self.d)] += 1
                c[("bwd", "dp", "REDUCE_SCATTER", padded * self.g)] += 1
        if self.mode == "zero2" and self.d > 1:
            # ZeRO-2 keeps only its gradient shard, so it reduce-scatters every micro-batch's
            # gradients (DeepSpeed stage 2) instead of accumulating them whole.
            c[("bwd", "dp", "REDUCE_SCATTER", ceil_to(self.stage_params(stage), self.d) * self.g)] += 1
        return +c

    def end_of_step(self, stage: int) -> list:
        """Step-phase collectives (dim, collective, comm_size) in order, "optimizer" for the update."""
        # One gradient bucket per model chunk unless overlap is on (docs/traffic-model.md, DP ddp);
        # Megatron wraps each model chunk in its own DDP buffer.
        chunks = self.chunk_params(stage)
        word = self.Vp // self.t * self.h
        per_chunk = []  # bucket sizes of each chunk, in backward order
        for c, n in enumerate(chunks):
            if self.mode == "dist-opt" and self.tied and self.p > 1 and (stage, c) == (0, 0):
                per_chunk.append([n - word, word])  # Megatron's distributed optimizer: the shared embedding alone
            elif self.mode == "dist-opt" and self.tied and self.p > 1 and (stage, c) == (self.p - 1, len(chunks) - 1):
                per_chunk.append([word, n - word])  # backward order: the head's copy is reduced first
            else:
                per_chunk.append([n])
        per_chunk = [[ceil_to(n, self.padding()) for n in chunk] for chunk in per_chunk]
        buckets = [n for chunk in per_chunk for n in chunk]
        sharded_optimizer = self.mode in ("zero1", "zero2", "dist-opt")
        out = []
        if self.d > 1 and self.mode == "ddp":
            out += [("dp", "ALL_REDUCE", n * self.g) for n in buckets]
        if self.d > 1 and self.mode in ("zero1", "dist-opt"):
            out += [("dp", "REDUCE_SCATTER", n * self.g) for n in buckets]
        if self.sp:
            n = len(self.stage_layers(stage))
            replicated = n * self.layer_replicated() + (self.final_norm() if stage == self.p - 1 else 0)
            out.append(("tp", "ALL_REDUCE", replicated * self.g))
        if self.tied and self.p > 1 and stage in (0, self.p - 1):
            # With per-unit sharding (zero3) only this rank's shard of the gradient is left.
            shards = self.d if self.mode == "zero3" else 1
            out.append(("emb", "ALL_REDUCE", -(-self.Vp // self.t * self.h * self.g // shards)))
        if self.sync and self.t * self.p * self.d > 1:
            # The rerun state machine's validate_results check: one int32 over every rank.
            out.append(("world", "ALL_REDUCE", 4))
        if self.sync:
            # Gradient statistics (optimizer.py, clip_grads.py): found-inf only with fp16 loss
            # scaling, then the squared norm, one fp32 each, over the model-parallel group
            # (tp x pp) with a replicated optimizer, over every rank with a sharded one.
            stats = ("world", self.t * self.p * self.d) if self.mode != "ddp" else ("mp", self.t * self.p)
            if stats[1] > 1:
                out += [(stats[0], "ALL_REDUCE", 4)] * (2 if self.dtype == "fp16" else 1)
        out.append("optimizer")
        if self.d > 1 and sharded_optimizer:  # each chunk's parameters are gathered in forward order
            out += [("dp", "ALL_GATHER", n * self.e // self.d) for chunk in per_chunk for n in reversed(chunk)]
        if self.sync:
            # train_step: update-successful and grad-norm reductions over the model-parallel group;
            # the last stage's logging loss, [sum, tokens] in fp32, over DP.
            out += [("mp", "ALL_REDUCE", 4)] * 2 if self.t * self.p > 1 else []
            out += [("dp", "ALL_REDUCE", 8)] if self.d > 1 and stage == self.p - 1 else []
            # training_log: the learning rate, fp32 MAX over the model-parallel group.
            out += [("mp", "ALL_REDUCE", 4)] if self.t * self.p > 1 else []
        return out

    def p2p_per_step(self, rank: int, stage: int) -> Counter:
        """("send"|"recv", phase, peer, bytes) -> count: m activations forward, m gradients back."""
        c = Counter()
        if self.v > 1:
            # Interleaved: every virtual stage but the model's last sends forward, every one but
            # the first receives; the last stage's chunks wrap around to the first stage.
            nxt = peer(rank, self.order, self.sizes, "pp", +1 if stage < self.p - 1 else 1 - self.p)
            prv = peer(rank, self.order, self.sizes, "pp", -1 if stage > 0 else self.p - 1)
            to_next = self.v - (stage == self.p - 1)
            from_prev = self.v - (stage == 0)
            c[("send", "fwd", nxt, self.p2p)] = c[("recv", "bwd", nxt, self.p2p)] = to_next * self.m
            c[("recv", "fwd", prv, self.p2p)] = c[("send", "bwd", prv, self.p2p)] = from_prev * self.m
            return c
        if stage < self.p - 1:
            nxt = peer(rank, self.order, self.sizes, "pp", +1)
            c[("send", "fwd", nxt, self.p2p)] = self.m
            c[("recv", "bwd", nxt, self.p2p)] = self.m
        if stage > 0:
            prv = peer(rank, self.order, self.sizes, "pp", -1)
            c[("recv", "fwd", prv, self.p2p)] = self.m
            c[("send", "bwd", prv, self.p2p)] = self.m
        return c

    def interleaved_passes(self, stage: int) -> list:
        """Megatron's interleaved 1F1B: virtual iteration k runs chunk (k mod p*v) // p (reversed
        for backward) on micro-batch (k // (p*v)) * p + k mod p; warm-up (p-i-1)*2 + (v-1)*p."""
        p, v, m = self.p, self.v, self.m
        total = m * v
        warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)

        def at(kind, k):
            chunk = k % (p * v) // p
            return (kind, chunk if kind == "F" else v - 1 - chunk, k // (p * v) * p + k % p)

        out = [at("F", k) for k in range(warmup)]
        for k in range(total - warmup):
            out += [at("F", warmup + k), at("B", k)]
        return out + [at("B", k) for k in range(total - warmup, total)]

    def passes(self, stage: int) -> list:
        """Pipeline order of one step as tokens: ("F"|"B", mb) compute passes and
        ("sf"|"rf"|"sb"|"rb", mb) p2p ops (Megatron's non-interleaved 1F1B, or GPipe)."""
        m, p, i = self.m, self.p, stage
        ev = []
        if self.schedule == "gpipe":
            for k in range(m):
                ev += [("rf", k), ("F", k), ("sf", k)]
            for k in range(m):
                ev += [("rb", k), ("B", k), ("sb", k)]
        else:
            w = min(p - i - 1, m)
            rest = m - w
            for k in range(w):
                ev += [("rf", k), ("F", k), ("sf", k)]
            if rest:
                ev.append(("rf", w))
            for k in range(rest):
                ev += [("F", w + k), ("sf", w + k), ("rb", k), ("B", k), ("sb", k)]
                if k < rest - 1:
                    ev.append(("rf", w + k + 1))
            for k in range(rest, m):
                ev += [("rb", k), ("B", k), ("sb", k)]
        no_prev, no_next = i == 0, i == p - 1
        return [(a, k) for a, k in ev if not ((a in ("rf", "sb") and no_prev) or (a in ("sf", "rb") and no_next))]


def gapped(tokens: list) -> list:
    """Compute passes in order; the p2p ops between two passes as one sorted group (paired ops
    are posted together, so their order within a gap is free)."""
    out, gap = [], []
    for tok in tokens:
        if tok[0] in ("F", "B"):
            if gap:
                out.append(tuple(sorted(gap)))
                gap = []
            out.append(tok)
        else:
            gap.append(tok)
    if gap:
        out.append(tuple(sorted(gap)))
    return out


def observed_tokens(nodes) -> list:
    """The same tokens read from a rank's nodes of one step (consecutive compute of one pass collapsed)."""
    out = []
    for n in nodes:
        if n.type == COMP and n.phase in ("fwd", "bwd"):
            tok = ("F" if n.phase == "fwd" else "B", n.mb)
            if not out or out[-1] != tok:
                out.append(tok)
        elif n.type in (SEND, RECV):
            kind = ("s" if n.type == SEND else "r") + ("f" if n.phase == "fwd" else "b")
            out.append((kind, n.mb))
    return out


# -- the trace sets under test ----------------------------------------------------------------

GPT_SMALL = dict(tp=4, pp=3, dp=2, vocab=1000, num_microbatches=4)
LLAMA = dict(arch="llama", layers=4, hidden=512, heads=8, kv_heads=4, ffn_hidden=1536, vocab=1000,
             tied_embeddings=False)
SPECS = {
    "demo": dict(),
    "sp": dict(sequence_parallel=True),
    "zero1": dict(dp_mode="zero1"),
    "zero2": dict(dp_mode="zero2"),
    "zero3": dict(dp_mode="zero3"),
    "gpipe": dict(schedule="gpipe"),
    "untied": dict(tied_embeddings=False),
    "bf16-grads": dict(grad_dtype="bf16"),
    "recompute-full": dict(recompute="full"),
    "recompute-full-sp": dict(recompute="full", sequence_parallel=True),
    "recompute-selective": dict(recompute="selective"),
    "t4p3d2-L6": dict(GPT_SMALL, layers=6),
    "t4p3d2-L7-steps2": dict(GPT_SMALL, layers=7, steps=2),
    "t4p3d2-L7-sp-zero1-megatron": dict(GPT_SMALL, layers=7, sequence_parallel=True, dp_mode="zero1", order="megatron"),
    "d3-ddp": dict(dp=3, global_batch=12),
    "d3-zero1-padding": dict(dp=3, dp_mode="zero1", global_batch=12),
    "d3-zero3-padding": dict(dp=3, dp_mode="zero3", global_batch=12),
    "d3-dist-opt": dict(dp=3, dp_mode="dist-opt", global_batch=12),
    "pp1-tied": dict(pp=1, num_microbatches=2),
    "p4-m2-gpipe-steps2": dict(tp=2, pp=4, dp=1, num_microbatches=2, schedule="gpipe", steps=2),
    "p4-m2-1f1b": dict(tp=2, pp=4, dp=1, num_microbatches=2),
    "interleaved-p3-v2": dict(pp=3, layers=6, schedule="interleaved", virtual_stages=2, num_microbatches=6),
    "llama-sp-zero1": dict(LLAMA, sequence_parallel=True, dp_mode="zero1"),
    "llama-ddp-megatron": dict(LLAMA, order="megatron", steps=2),
}


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("traffic")
    out = {}
    for name, overrides in SPECS.items():
        write_trace_set(build_spec("demo", overrides=overrides), root / name, jobs=1)
        out[name] = load_set(root / name)
    return out


def model(ts: DecodedSet) -> M:
    mm = M.of(ts.spec)
    assert ts.spec["num_microbatches"] == mm.m
    return mm


# -- literal numbers for the demo (hand arithmetic, see comments) ------------------------------

def test_demo_literal_numbers(sets):
    ts = sets["demo"]
    # b1 s512 h512 bf16: b*s*h*e = 524,288 B; 4 micro-batches; 2 layers per stage.
    act = 524_288
    # Stage 0 (ranks 0, 1, 4, 5): per micro-batch 2 layers x 4 + 1 embedding AllReduce = 9, x4.
    # Stage-0 parameters per TP rank: 2 x (12*512^2/2 + 7*512/2 + 6*512) = 2 x 1,577,728
    #   + word embedding 1024/2*512 = 262,144 + positions 512*512 = 262,144 -> 3,679,744.
    # Stage 1 (ranks 2, 3, 6, 7): 2 x 1,577,728 + tied copy 262,144 + final norm 1,024 = 3,418,624;
    #   9 AllReduces of b*s*h*e per micro-batch (LM head dgrad) and 3 cross-entropy ones of 1*512*4 B.
    # Synchronising collectives: per micro-batch TP rank 0 broadcasts (an AllGather of N/2 B from
    #   each rank) tokens and position ids, 512 int64 = 4,096 B, on stage 0; labels (4,096 B) and
    #   the fp32 loss mask (2,048 B) on stage 1; the 512x512 bool attention mask (262,144 B) on
    #   both. Per step: grad norm, update-ok, grad-norm max and learning rate, 4 B each, over
    #   tp x pp (4 ranks); the rerun check, one int32 over all 8 ranks; stage 1 also reduces the
    #   logging loss (2 fp32) over DP.
    mp = ("mp", "ALL_REDUCE"), (4, 16)
    world = ("world", "ALL_REDUCE"), (1, 4)
    for rank in (0, 1, 4, 5):
        got = collective_totals(ts.nodes[rank])
        assert got == {
            ("tp", "ALL_REDUCE"): (36, 36 * act),
            ("tp", "ALL_GATHER"): (12, 4 * (4096 + 4096 + 262_144) // 2),
            ("dp", "ALL_REDUCE"): (1, 3_679_744 * 4),
            ("emb", "ALL_REDUCE"): (1, 512 * 512 * 4),
            mp[0]: mp[1],
            world[0]: world[1],
        }, rank
        assert p2p_counter(rank, ts.nodes[rank]) == {("send", "fwd", rank + 2, act): 4, ("recv", "bwd", rank + 2, act): 4}
    for rank in (2, 3, 6, 7):
        got = collective_totals(ts.nodes[rank])
        assert got == {
            ("tp", "ALL_REDUCE"): (36 + 12, 36 * act + 12 * 2048),
            ("tp", "ALL_GATHER"): (12, 4 * (4096 + 2048 + 262_144) // 2),
            ("dp", "ALL_REDUCE"): (2, 3_418_624 * 4 + 8),
            ("emb", "ALL_REDUCE"): (1, 512 * 512 * 4),
            mp[0]: mp[1],
            world[0]: world[1],
        }, rank
        assert p2p_counter(rank, ts.nodes[rank]) == {("recv", "fwd", rank - 2, act): 4, ("send", "bwd", rank - 2, act): 4}


def test_model_arithmetic_matches_design_formulas():
    # Guard our own arithmetic: GPT layer 12h^2 + 13h in total, Llama 2-70B-like GQA layer.
    gpt = M("gpt", 4, 512, 2048, 8, 8, 1024, 512, True, 1, 2, 1, 1, 1, 2, 4, False, "1f1b", "ddp", 1, "tp-pp-dp")
    assert gpt.layer_params() == 12 * 512**2 + 13 * 512
    llama = dataclasses.replace(gpt, arch="llama", h=8192, f=28672, heads=64, kv=8)
    assert llama.layer_params() == 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert dataclasses.replace(gpt, L=7, p=3).layers_per_stage() == [2, 3, 2]
    assert dataclasses.replace(gpt, L=6, p=4).layers_per_stage() == [1, 2, 2, 1]
    assert dataclasses.replace(gpt, V=50257, t=8).Vp == 51200
    assert dataclasses.replace(gpt, L=6, p=3, v=2).stage_layers(1) == [1, 4]


# -- every spec, every rank, every step --------------------------------------------------------

@pytest.mark.parametrize("name", SPECS)
def test_collectives_per_microbatch(sets, name):
    ts = sets[name]
    mm = model(ts)
    for rank, nodes in ts.nodes.items():
        expected = mm.per_microbatch(ts.stage(rank))
        for step, step_nodes in by_step(nodes).items():
            per_mb: dict = {}
            for n in step_nodes:
                if n.type == COLL and n.phase != "step":
                    per_mb.setdefault(n.mb, []).append(n)
            assert set(per_mb) <= set(range(mm.m)), (rank, step, sorted(per_mb, key=str))
            for mb in range(mm.m):
                got = collective_counter(per_mb.get(mb, []))
                assert got == expected, f"{name}: rank {rank} step {step} mb {mb}"


@pytest.mark.parametrize("name", SPECS)
def test_end_of_step_traffic_in_order(sets, name):
    ts = sets[name]
    mm = model(ts)
    for rank, nodes in ts.nodes.items():
        expected = mm.end_of_step(ts.stage(rank))
        steps = by_step(nodes)
        assert sorted(steps) == list(range(mm.steps))
        for step, step_nodes in steps.items():
            got = []
            for n in step_nodes:
                if n.phase != "step":
                    continue
                if n.type == COLL:
                    got.append((n.dim, COLL_TYPES[n.ctype], n.size))
                elif n.type == COMP:
                    got.append("optimizer")
            assert got == expected, f"{name}: rank {rank} step {step}"


@pytest.mark.parametrize("name", SPECS)
def test_pipeline_sends_and_recvs(sets, name):
    ts = sets[name]
    mm = model(ts)
    for rank, nodes in ts.nodes.items():
        expected = mm.p2p_per_step(rank, ts.stage(rank))
        for step, step_nodes in by_step(nodes).items():
            assert p2p_counter(rank, step_nodes) == expected, f"{name}: rank {rank} step {step}"
            # one activation and one gradient per micro-batch, boundary (and model chunk)
            per_mb = Counter((n.type, n.phase, n.mb) for n in step_nodes if n.type in (SEND, RECV))
            assert set(per_mb.values()) <= set(range(1, mm.v + 1)), (rank, step)


@pytest.mark.parametrize("name", [n for n in SPECS if SPECS[n].get("schedule") != "interleaved"])
def test_pipeline_schedule_order(sets, name):
    ts = sets[name]
    mm = model(ts)
    for rank, nodes in ts.nodes.items():
        stage = ts.stage(rank)
        for step, step_nodes in by_step(nodes).items():
            got = observed_tokens(step_nodes)
            assert gapped(got) == gapped(mm.passes(stage)), f"{name}: rank {rank} stage {stage} step {step}"
            computes = [tok for tok in got if tok[0] in ("F", "B")]
            if mm.schedule == "1f1b":
                # warm-up min(p-i-1, m) forwards, then the steady state's first forward, before any backward
                first_b = next(i for i, tok in enumerate(computes) if tok[0] == "B")
                assert first_b == min(mm.p - stage, mm.m), (rank, computes)
            else:
                assert computes == [("F", k) for k in range(mm.m)] + [("B", k) for k in range(mm.m)]


def test_interleaved_schedule_order(sets):
    ts = sets["interleaved-p3-v2"]
    mm = model(ts)
    for rank, nodes in ts.nodes.items():
        stage = ts.stage(rank)
        got = []
        for n in nodes:  # passes, identified by the chunk their layers belong to
            if n.type == COMP and n.phase in ("fwd", "bwd") and n.get("layer") is not None:
                tok = ("F" if n.phase == "fwd" else "B", mm.chunk_of(n.get("layer")), n.mb)
                if not got or got[-1] != tok:
                    got.append(tok)
        expected = mm.interleaved_passes(stage)
        assert got == expected, f"rank {rank} stage {stage}"
        warmup = (mm.p - stage - 1) * 2 + (mm.v - 1) * mm.p  # docs/traffic-model.md: interleaved warm-up
        assert next(i for i, tok in enumerate(got) if tok[0] == "B") == min(warmup + 1, mm.m * mm.v)


@pytest.mark.parametrize("name", ["demo", "sp", "t4p3d2-L7-steps2", "llama-sp-zero1", "recompute-full",
                                  "recompute-full-sp", "interleaved-p3-v2"])
def test_tp_collectives_per_layer(sets, name):
    ts = sets[name]
    mm = model(ts)
    replay = 1 if mm.recompute == "full" else 0
    per_layer_expected = (
        Counter({("fwd", "ALL_REDUCE"): 2, ("bwd", "ALL_REDUCE"): 2 + 2 * replay}) if not mm.sp else
        Counter({("fwd", "ALL_GATHER"): 2, ("fwd", "REDUCE_SCATTER"): 2,
                 ("bwd", "ALL_GATHER"): 4 + 2 * replay, ("bwd", "REDUCE_SCATTER"): 2 + 2 * replay})
    )
    for rank, nodes in ts.nodes.items():
        stage = ts.stage(rank)
        layers = set(mm.stage_layers(stage))
        seen = {n.get("layer") for n in nodes if n.type == COMP and n.get("layer") is not None}
        assert seen == layers, (rank, stage)
        per_layer: dict = {}
        for n in nodes:
            if n.type == COLL and n.dim == "tp" and n.get("layer") is not None:
                per_layer.setdefault((n.step, n.mb, n.get("layer")), Counter())[(n.phase, COLL_TYPES[n.ctype])] += 1
        assert set(per_layer) == {(s, mb, layer) for s in range(mm.steps) for mb in range(mm.m) for layer in layers}
        assert all(c == per_layer_expected for c in per_layer.values()), rank


# -- cross-rank consistency (the independent oracle) and stream dependencies ------------------

@pytest.mark.parametrize("name", SPECS)
def test_set_is_consistent(sets, name):
    ts = sets[name]
    assert consistency_problems(ts) == []
    assert group_order_problems(ts) == []
    assert unfinished(ts) == [], "some nodes never complete: the set deadlocks"


@pytest.mark.parametrize("name", SPECS)
def test_node_contract(sets, name):
    ts = sets[name]
    for rank, nodes in ts.nodes.items():
        assert [n.id for n in nodes] == sorted({n.id for n in nodes})
        for n in nodes:
            assert all(d < n.id for d in n.deps), f"rank {rank} node {n.id}: README says deps name earlier nodes"
            assert n.phase in ("fwd", "bwd", "step"), (rank, n.id)
            assert n.get("is_cpu_op") is False
            if n.type == COMP:
                # a kernel shorter than the carried rounding error may take 0 whole microseconds
                assert n.duration >= 0 and n.get("tensor_size", 0) > 0 and n.get("num_ops", 0) > 0, (rank, n.name)
            else:
                assert n.dim in ("tp", "pp", "dp", "emb", "mp", "world") and n.size > 0, (rank, n.name)
                if n.phase != "step":
                    assert n.mb is not None, (rank, n.name)


def test_every_node_carries_step(sets):
    # README output contract: "every node | phase (fwd/bwd/step), step, and where they apply ...".
    ts = sets["t4p3d2-L7-steps2"]
    for rank, nodes in ts.nodes.items():
        missing = [n.id for n in nodes if not isinstance(n.attrs.get("step"), int)]
        assert not missing, f"rank {rank}: {len(missing)} nodes lack the step attribute, e.g. node {missing[0]}"


def first_rank_per_stage(ts: DecodedSet) -> list[int]:
    return [min(r for r in ts.nodes if ts.stage(r) == s) for s in range(ts.sizes["pp"])]


@pytest.mark.parametrize("name", ["demo", "sp", "zero1", "zero2", "zero3", "gpipe", "recompute-full-sp",
                                  "t4p3d2-L7-steps2"])
def test_dependencies_follow_the_streams(sets, name):
    ts = sets[name]
    for rank in first_rank_per_stage(ts):
        nodes = ts.nodes[rank]
        anc = ancestors(nodes)
        sends = {n.id for n in nodes if n.type == SEND}
        comps = [n for n in nodes if n.type == COMP]
        # A PP send blocks under Megatron's schedules without --overlap-p2p-comm
        # (p2p_communication.py waits for its requests): the next compute waits for it; the recvs
        # posted with it do not. torch's GPipe waits for its forward sends before the first
        # backward, the others when the step ends.
        torch_schedule = name == "gpipe"
        first_backward = min(c.id for c in comps if c.phase == "bwd")
        for s in sends:
            following = [c for c in comps if c.id > s]
            if following:
                if not torch_schedule:
                    assert depends_on(anc, following[0].id, s), (rank, s)
                    continue
                passes = [c for c in following if c.phase != "step"]
                if passes:
                    waited = passes[0].id == first_backward and s < first_backward
                    assert depends_on(anc, passes[0].id, s) == waited, (rank, s)
                optimizer = next(c for c in following if c.name.endswith("optimizer"))
                assert depends_on(anc, optimizer.id, s), (rank, s)
        recv_after_send = [n for n in nodes if n.type == RECV and set(n.deps) & sends]
        # GPipe: only the first backward's receive, posted once the forward sends are done.
        assert all(torch_schedule and n.phase == "bwd" and n.id < first_backward for n in recv_after_send), rank
        # Compute is one chain.
        for a, b in zip(comps, comps[1:], strict=False):
            assert depends_on(anc, b.id, a.id), (rank, a.name, b.name)
        # A forward TP collective gates the next compute; every TP collective gates some later
        # compute of its step (backward reductions may overlap the weight-gradient GEMM).
        for n in nodes:
            if n.type == COLL and n.dim == "tp" and n.phase != "step":
                later = [c for c in comps if c.id > n.id and c.step == n.step]
                assert any(depends_on(anc, c.id, n.id) for c in later), (rank, n.name)
                if n.phase == "fwd":
                    assert depends_on(anc, later[0].id, n.id), (rank, n.name)
        # A recv gates the compute of its pass; a send waits for the pass's compute and its TP
        # reductions (what it sends is their result).
        passes: dict = {}
        for c in comps:
            if c.phase in ("fwd", "bwd"):
                passes.setdefault((c.step, c.phase, c.mb), []).append(c.id)
        tp_of_pass: dict = {}
        for n in nodes:
            if n.type == COLL and n.dim == "tp" and n.phase != "step":
                tp_of_pass.setdefault((n.step, n.phase, n.mb), []).append(n.id)
        for n in nodes:
            key = (n.step, n.phase, n.mb)
            if n.type == RECV:
                # its first consumer is the pass's compute, or (SP) the AllGather of the gradient
                assert depends_on(anc, passes[key][0], n.id), (rank, n.name)
                consumers = [m for m in nodes if n.id in m.deps]
                assert consumers and all(m.type in (COMP, COLL) and (m.step, m.phase, m.mb) == key for m in consumers)
            elif n.type == SEND:
                assert depends_on(anc, n.id, passes[key][-1]), (rank, n.name)
                assert all(depends_on(anc, n.id, c) for c in tp_of_pass.get(key, [])), (rank, n.name)
        # DP gradient reductions follow backward compute; the optimizer waits for every gradient
        # reduction of its step and for the end-of-step TP and embedding traffic.
        for n in nodes:
            gradient = (n.type == COLL and n.dim == "dp" and COLL_TYPES[n.ctype] in ("ALL_REDUCE", "REDUCE_SCATTER")
                        and not n.name.endswith("_loss"))  # the logging loss is reduced after the step
            end_of_step = n.type == COLL and n.phase == "step" and n.dim in ("tp", "emb")
            if gradient or end_of_step:
                opt = next(c for c in comps if c.phase == "step" and c.step == n.step)
                assert depends_on(anc, opt.id, n.id), (rank, n.name)
            if gradient:
                assert any(depends_on(anc, n.id, c.id) for c in comps if c.phase == "bwd" and c.step == n.step)


# -- the oracle itself can fail ------------------------------------------------------------------

def _mutate(ts: DecodedSet, rank: int, pick, **changes) -> DecodedSet:
    nodes = list(ts.nodes[rank])
    i = next(i for i, n in enumerate(nodes) if pick(n))
    n = nodes[i]
    attrs = dict(n.attrs, **changes.pop("attrs", {}))
    nodes[i] = dataclasses.replace(n, attrs=attrs, **changes)
    return dataclasses.replace(ts, nodes={**ts.nodes, rank: nodes})


def test_oracle_catches_broken_sets(sets):
    ts = sets["demo"]
    is_tp = lambda n: n.type == COLL and n.dim == "tp"  # noqa: E731
    wrong_size = _mutate(ts, 1, is_tp, attrs={"comm_size": 1})
    assert collective_problems(wrong_size)
    wrong_group = _mutate(ts, 0, is_tp, attrs={"pg_name": "2"})  # rank 0 is not in TP group {2, 3}
    assert collective_problems(wrong_group)
    unknown_group = _mutate(ts, 0, is_tp, attrs={"pg_name": "999"})
    assert collective_problems(unknown_group)
    send = lambda n: n.type == SEND  # noqa: E731
    wrong_tag = _mutate(ts, 0, send, attrs={"comm_tag": 77})
    assert p2p_problems(wrong_tag)
    assert unfinished(wrong_tag), "a recv without its send must never finish"
    dangling = _mutate(ts, 0, lambda n: n.id == 5, deps=(10_000,))
    assert node_problems(0, dangling.nodes[0])
    dropped = dataclasses.replace(ts, nodes={**ts.nodes, 3: [n for n in ts.nodes[3] if n.type != COLL or n.dim != "tp"]})
    assert collective_problems(dropped) and unfinished(dropped)



def test_a_set_already_judged_sound_is_judged_again_once_a_byte_differs(make_set):
    """make_set and the CLI runner judge a byte-identical set once a session; a changed one anew."""
    from mutate import drop, edit, of_type

    _, out, _ = make_set("demo")  # judged sound
    assert_sound(out)
    edit(out, 3, lambda ns: drop(ns, of_type(ns, COLL)[0].id))  # rank 3 skips its first collective
    with pytest.raises(AssertionError):
        assert_sound(out)

# -- bucketing and the GPT-3 175B worked check ----------------------------------------------------

def megatron_buckets(params: list[tuple[int, bool]], bucket: int | None, dist_opt: bool, pad: int) -> list[int]:
    """Bucket sizes (elements, padded) as Megatron lays out a gradient buffer
    (core/distributed/param_and_grad_buffer.py, optimizer/distrib_optimizer.py): parameters in
    the given (backward) order; a bucket closes after the parameter whose end is at least
    `bucket` elements past the bucket's start; its end is padded to `pad`. The distributed
    optimizer also starts each parameter on a multiple of 64 and puts a shared embedding in a
    bucket of its own."""
    sizes, start, opened, count = [], 0, 0, 0
    for n, shared in params:
        if dist_opt:
            start = ceil_to(start, 64)
            if shared and count:
                end = ceil_to(start, pad)
                sizes.append(end - opened)
                start = opened = end
                count = 0
        start += n
        count += 1
        if (bucket and start - opened >= bucket) or (dist_opt and shared):
            end = ceil_to(start, pad)
            sizes.append(end - opened)
            start = opened = end
            count = 0
    if count:
        sizes.append(ceil_to(start, pad) - opened)
    return sizes


def deepspeed_buckets(params: list[tuple[int, bool]], bucket: int, pad: int) -> list[int]:
    """Bucket sizes (elements, padded) as DeepSpeed's stage 1/2 fills its reduce bucket
    (runtime/zero/stage_1_and_2.py, reduce_independent_p_g_buckets_and_remove_grads): the bucket
    is reduced before a parameter that would take it past `bucket` elements; a parameter larger
    than a bucket goes alone."""
    sizes, held = [], 0
    for n, _ in params:
        if held and held + n > bucket:
            sizes.append(ceil_to(held, pad))
            held = 0
        held += n
    return sizes + ([ceil_to(held, pad)] if held else [])


def test_zero2_buckets_are_deepspeeds_and_memory_holds_the_largest():
    """zero2 is DeepSpeed's stage 2: reduce buckets of 5e8 elements on every stage, closed before
    they would overflow, reduce-scattered every micro-batch; the memory model holds the largest
    of those same buckets (one rule for time and memory). GPT-3 175B at t8: a layer is
    12 * 12288**2 / 8 = 226.5 M parameters per rank, so a bucket holds two layers (453 M), not
    the 40-48 M of Megatron's overlapped buckets."""
    from traceforge.memory.states import stage_states
    from traceforge.program.stage import stage_program

    spec = build_spec("gpt3-175b", overrides=dict(dp_mode="zero2", num_microbatches=None, global_batch=24))
    mm = M.of(spec.to_dict())
    for stage in (0, 5, 15):
        expected = deepspeed_buckets(mm.backward_params(stage), 500_000_000, mm.d)
        assert all(n <= ceil_to(500_000_000, mm.d) for n in expected) and len(expected) > 1
        dp = [op for op in _count(stage_program(spec, stage).ops, "dp") if "grad_bucket" in op.name]
        assert [op.comm_size for op in dp] == [n * mm.g for n in expected] * mm.m, stage
        assert stage_states(spec, stage).dp_buffers == max(expected) * mm.g, stage


def test_gradient_buckets(make_set):
    """Buckets close at parameter boundaries, as Megatron's: each bucket of a 1 MiB setting
    ends with the parameter that reaches 2**18 fp32 elements."""
    spec, out, _ = make_set("demo", bucket_mb=1)
    ts = load_set(out)
    mm = model(ts)
    bucket = 2**20 // mm.g  # elements per 1 MiB bucket of fp32 gradients
    for rank, nodes in ts.nodes.items():
        stage = ts.stage(rank)
        G = mm.stage_params(stage)
        sizes = [n.size for n in nodes if n.type == COLL and n.dim == "dp" and "grad_bucket" in n.name]
        assert all(COLL_TYPES[n.ctype] == "ALL_REDUCE" for n in nodes if n.type == COLL and n.dim == "dp")
        assert sum(n for n, _ in mm.backward_params(stage)) == G
        assert sizes == [n * mm.g for n in megatron_buckets(mm.backward_params(stage), bucket, False, 1)], rank
        assert sum(sizes) == G * mm.g and min(sizes[:-1]) >= bucket * mm.g, rank
    spec, out, _ = make_set("demo", bucket_mb=0)
    ts = load_set(out)
    for rank, nodes in ts.nodes.items():
        sizes = [n.size for n in nodes if n.type == COLL and n.dim == "dp" and "grad_bucket" in n.name]
        assert sizes == [mm.stage_params(ts.stage(rank)) * mm.g]


def _count(ops, group, types=None):
    return [op for op in ops if int(op.type) == COLL and op.group == group
            and (types is None or int(op.comm_type) in types)]


def test_gpt3_175b_worked_check():
    """The GPT-3 175B layout (docs/traffic-model.md, Sources): t8 p16 d12, b1, global batch 1536 (m = 128), s 2048."""
    from traceforge.program.stage import stage_program  # read the planner's output, not its arithmetic

    spec = build_spec("gpt3-175b")
    mm = M.of(spec.to_dict())
    assert (mm.t, mm.p, mm.d, mm.m, mm.s) == (8, 16, 12, 128, 2048)
    assert mm.act == 50_331_648
    G = mm.stage_params(5)
    assert G == 6 * (12 * 12288**2 // 8 + 7 * 12288 // 8 + 6 * 12288) == 1_359_461_376  # "1.359 B"
    # Psi = 174.6 B: 96 layers of 12h^2 + 13h, word embedding V*h (unpadded), positions s*h, final norm.
    h = 12288
    assert round((96 * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h) / 1e8) == 1746

    for stage, extra_ar in ((5, 0), (0, 128), (15, 128)):
        ops = stage_program(spec, stage).ops
        # the batch broadcasts from TP rank 0 (AllGathers, see test_demo_literal_numbers): three
        # tensors per micro-batch on the first and the last stage, none in between
        bcast = [op for op in _count(ops, "tp") if "bcast" in op.name]
        assert len(bcast) == (3 * 128 if stage in (0, 15) else 0), stage
        tp = [op for op in _count(ops, "tp") if "bcast" not in op.name]
        big = [op for op in tp if op.comm_size == mm.act]
        assert all(int(op.comm_type) == AR for op in tp)
        assert len(big) == 3072 + extra_ar, stage  # 4 per layer x 6 layers x 128 micro-batches (+ edges)
        small = [op for op in tp if op.comm_size != mm.act]
        assert len(small) == (3 * 128 if stage == 15 else 0) and all(op.comm_size == 2048 * 4 for op in small)
        p2p = [op for op in ops if int(op.type) in (SEND, RECV)]
        assert all(op.comm_size == mm.act for op in p2p)
        assert len(p2p) == (2 if 0 < stage < 15 else 1) * 2 * 128

    # DP: 4 x 1.359 B = 5.44 GB of fp32 gradients, one bucket (no overlap), in the DP group only.
    dp = _count(stage_program(spec, 5).ops, "dp")  # (stage 5 is not the last: no logging-loss reduction)
    assert [(int(op.comm_type), op.comm_size) for op in dp] == [(AR, 4 * G)]
    assert round(4 * G / 1e7) == 544


def test_overlapped_gradient_buckets_on_the_first_stage_only():
    """Megatron (distributed_data_parallel.py): with --overlap-grad-reduce, buckets of
    max(4e7, 1e6*d) elements, and only on the first pipeline stage (elsewhere DP is off the
    critical path, so bucketing is turned off)."""
    from traceforge.program.stage import stage_program

    spec = build_spec("gpt3-175b", overrides=dict(overlap_grad_reduce=True))
    mm = M.of(spec.to_dict())
    bucket = max(MEGATRON_MIN_BUCKET, 1_000_000 * mm.d)
    for stage in (0, 5, 15):
        G = mm.stage_params(stage)
        dp = [op for op in _count(stage_program(spec, stage).ops, "dp") if "grad_bucket" in op.name]
        assert all(int(op.comm_type) == AR for op in dp)
        assert sum(op.comm_size for op in dp) == G * mm.g, stage
        expected = megatron_buckets(mm.backward_params(stage), bucket if stage == 0 else None, False, 1)
        assert [op.comm_size for op in dp] == [n * mm.g for n in expected], stage
        if stage == 0:  # every bucket but the last reaches the size, by less than one parameter
            assert all(bucket * mm.g <= op.comm_size < (bucket + 4 * 12288**2 // 8) * mm.g for op in dp[:-1])
