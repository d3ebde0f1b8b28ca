"""The GOAL export: LogGOPSim's grammar, every operation completes, collectives move the bytes their
algorithm must, point-to-point traffic is kept, and `traceforge check --expand` proves the same.

The parser and the replay here are written from LogGOPSim's txt2bin grammar and MPI matching
(a receive takes the oldest message from its source with its tag), not from traceforge.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter, defaultdict, deque
from fractions import Fraction
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceforge.check.run import check_trace_set
from traceforge.cli import app, load_commands
from traceforge.export.expand import write_chakra
from traceforge.read.reader import attrs, find_rank_files, read_trace

LABEL = r"[a-zA-Z][a-zA-Z0-9_]*"
OP = re.compile(rf"^({LABEL}): (?:calc (\d+)(?: cpu (\d+))?|send (\d+)b to (\d+) tag (\d+)"
                rf"|recv (\d+)b from (\d+) tag (\d+))$")
REQ = re.compile(rf"^({LABEL}) requires ({LABEL})$")
TAG_LIMIT = 500_000_000


def parse_goal(path: Path) -> dict[int, dict]:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("//")]
    assert lines[0].startswith("num_ranks ")
    world = int(lines[0].split()[1])
    ranks: dict[int, dict] = {}
    current = None
    for line in lines[1:]:
        if line.startswith("rank "):
            r = int(line.split()[1])
            assert line == f"rank {r} {{" and r == len(ranks), "ranks must come in ascending order from 0"
            current = ranks[r] = {"ops": {}, "order": [], "requires": defaultdict(list)}
        elif line == "}":
            current = None
        else:
            assert current is not None
            m = OP.match(line)
            if m:
                label = m[1]
                assert label not in current["ops"], f"label {label} twice"
                if m[2] is not None:
                    current["ops"][label] = ("calc", int(m[2]), int(m[3] or 0))
                elif m[4] is not None:
                    current["ops"][label] = ("send", int(m[4]), int(m[5]), int(m[6]))
                else:
                    current["ops"][label] = ("recv", int(m[7]), int(m[8]), int(m[9]))
                current["order"].append(label)
                continue
            m = REQ.match(line)
            assert m, f"not GOAL: {line!r}"
            assert m[1] in current["ops"] and m[2] in current["ops"], "requires must follow both labels"
            current["requires"][m[1]].append(m[2])
    assert len(ranks) == world
    return ranks


def replay(ranks: dict[int, dict]) -> list[tuple[int, str]]:
    """Run every rank; a send completes at once (eager) and a receive once a message from its
    source with its tag has arrived, oldest first, of the same size. Returns what never ran."""
    done: dict[int, set[str]] = {r: set() for r in ranks}
    channels: dict[tuple[int, int, int], deque] = defaultdict(deque)
    waiting = {r: list(g["order"]) for r, g in ranks.items()}
    progress = True
    while progress:
        progress = False
        for r, g in ranks.items():
            still = []
            for label in waiting[r]:
                if not all(d in done[r] for d in g["requires"][label]):
                    still.append(label)
                    continue
                op = g["ops"][label]
                if op[0] == "send":
                    channels[(r, op[2], op[3])].append(op[1])
                elif op[0] == "recv":
                    queue = channels[(op[2], r, op[3])]
                    if not queue:
                        still.append(label)
                        continue
                    assert queue.popleft() == op[1], f"rank {r} {label}: size differs from the matched send"
                done[r].add(label)
                progress = True
            waiting[r] = still
    assert all(not q for q in channels.values()), "messages nobody received"
    return [(r, label) for r, labels in waiting.items() for label in labels]


def export(directory: Path, out: Path, *args: str):
    load_commands()
    return CliRunner().invoke(app, ["export", str(directory), "--format", "goal", "-o", str(out), *args])


def original(directory: Path):
    """Per rank: collectives (type, size, group members) and p2p (src, dst, tag, size)."""
    import json

    groups = {int(k): v for k, v in json.loads((directory / "comm_group.json").read_text()).items()}
    _, files = find_rank_files(directory)
    colls, p2p = [], Counter()
    for path in files.values():
        for node in read_trace(path).nodes:
            a = attrs(node)
            if node.type == 7:
                colls.append((a["comm_type"], a["comm_size"], len(groups[int(a["pg_name"])])))
            elif node.type in (5, 6):
                p2p[(node.type, a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"])] += 1
    return colls, p2p


def expected_bytes(colls, algorithm: str) -> Fraction:
    """Bytes all members of each collective send together, from the algorithms' definitions."""
    total = Fraction(0)
    for ctype, size, n in colls:
        power = n & (n - 1) == 0
        alg = algorithm if power else "ring"
        if ctype == 0:  # AllReduce
            doubling = alg == "recursive-doubling"
            total += Fraction(size * (n.bit_length() - 1)) if doubling else Fraction(2 * (n - 1) * size, n)
        elif ctype == 2:  # AllGather: each rank's shard reaches n-1 others
            total += (n - 1) * size
        else:  # ReduceScatter of the full input, AllToAll of the full buffer
            total += Fraction((n - 1) * size, n)
    return total


SETS = {
    "pp-zero3": dict(dp_mode="zero3"),
    "interleaved": dict(tp=1, pp=4, dp=2, layers=8, num_microbatches=4, schedule="interleaved", virtual_stages=2),
    "moe-cp": dict(arch="llama", layers=2, hidden=256, ffn_hidden=512, heads=8, kv_heads=8, vocab=1000, seq_len=256,
                   tied_embeddings=False, experts=8, tp=2, sequence_parallel=True, dp=4, ep=4, cp=2, order="megatron",
                   num_microbatches=2, moe_layer_freq=2),
    "dp3": dict(dp=3, num_microbatches=2),  # groups of 3: the power-of-two algorithms fall back to ring
}


@pytest.mark.parametrize("algorithm", ["ring", "recursive-doubling", "halving-doubling"])
@pytest.mark.parametrize("name", SETS)
def test_goal_runs_to_completion_and_moves_the_algorithms_bytes(make_set, tmp_path, name, algorithm):
    _, out, doc = make_set(**SETS[name])
    done = export(out, tmp_path / "goal", "--collective-algorithm", algorithm)
    assert done.exit_code == 0, done.output
    ranks = parse_goal(tmp_path / "goal" / "workload.goal")
    assert len(ranks) == doc["world_size"]
    assert replay(ranks) == [], "some operations never run: the schedule deadlocks"
    colls, p2p = original(out)
    sent_coll = sum(op[1] for g in ranks.values() for op in g["ops"].values()
                    if op[0] == "send" and op[3] >= 499_936_000)
    # Chunks are whole bytes: a buffer not divisible by the group rounds each step's chunk up, at
    # most one byte per step and member (2(n-1) steps at most), e.g. the 4-byte grad-norm AllReduce.
    slack = sum(2 * (n - 1) * n for _, size, n in colls if size % n)
    assert expected_bytes(colls, algorithm) <= sent_coll <= expected_bytes(colls, algorithm) + slack
    # point-to-point traffic is kept as it was, below the collectives' tags
    kept = Counter()
    for r, g in ranks.items():
        for op in g["ops"].values():
            if op[0] in ("send", "recv") and op[3] < 499_936_000:
                src, dst = (r, op[2]) if op[0] == "send" else (op[2], r)
                kept[(5 if op[0] == "send" else 6, src, dst, op[3], op[1])] += 1
    assert kept == p2p
    assert all(op[3] < TAG_LIMIT for g in ranks.values() for op in g["ops"].values() if op[0] != "calc")
    # compute keeps its time (ns per us); everything on cpu 0 (LogGOPSim carries time across a
    # dependency only on one cpu)
    assert all(op[2] == 0 for g in ranks.values() for op in g["ops"].values() if op[0] == "calc")
    comp = sum(op[1] for g in ranks.values() for op in g["ops"].values() if op[0] == "calc")
    _, files = find_rank_files(out)
    assert comp == 1000 * sum(n.duration_micros for p in files.values() for n in read_trace(p).nodes if n.type == 4)


@pytest.mark.parametrize("name", ["pp-zero3", "interleaved", "moe-cp"])
def test_check_proves_the_expansion_deadlock_free(make_set, tmp_path, name):
    _, out, _ = make_set(**SETS[name])
    for algorithm in ("ring", "halving-doubling"):
        write_chakra(out, tmp_path / algorithm, algorithm)
        result = check_trace_set(tmp_path / algorithm, jobs=1)
        assert result.findings == [], result.summary()
    load_commands()
    cli = CliRunner().invoke(app, ["check", str(out), "--expand", "recursive-doubling"])
    assert cli.exit_code == 0 and "point-to-point expansion" in cli.output


def test_check_finds_a_broken_expansion(make_set, tmp_path):
    """The proof can fail: drop one step's receive and check reports the stall."""
    from mutate import drop, edit, of_type

    _, out, _ = make_set()
    write_chakra(out, tmp_path / "x", "ring")
    edit(tmp_path / "x", 1, lambda ns: drop(ns, of_type(ns, 6)[3].id))
    result = check_trace_set(tmp_path / "x", jobs=1)
    assert not result.ok and {f.kind for f in result.errors} & {"p2p", "deadlock"}


def test_time_unit_ps(make_set, tmp_path):
    _, out, _ = make_set()
    assert export(out, tmp_path / "ns").exit_code == 0
    assert export(out, tmp_path / "ps", "--time-unit", "ps").exit_code == 0
    ns, ps = parse_goal(tmp_path / "ns" / "workload.goal"), parse_goal(tmp_path / "ps" / "workload.goal")
    for r in ns:
        for label, op in ns[r]["ops"].items():
            if op[0] == "calc":
                assert ps[r]["ops"][label][1] == 1000 * op[1]


@pytest.mark.parametrize("args, message", [
    (["--format", "loggops"], "--format 'loggops' is not supported"),
    (["--format", "goal", "--collective-algorithm", "tree"], "--collective-algorithm 'tree' is not known"),
    (["--format", "goal", "--time-unit", "fs"], "--time-unit 'fs' is not known"),
    (["--collective-algorithm", "ring", "--time-unit", "ps"], "add --format goal"),
])
def test_bad_export_flags(make_set, tmp_path, args, message):
    _, out, _ = make_set()
    load_commands()
    result = CliRunner().invoke(app, ["export", str(out), "-o", str(tmp_path / "x"), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_foreign_set_without_its_groups_is_refused_whole(make_set, tmp_path):
    _, out, _ = make_set()
    (out / "comm_group.json").write_text('{"1": [0, 1]}')
    result = export(out, tmp_path / "x")
    assert result.exit_code == 2 and "comm_group.json" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x*"))


BIN, TXT2BIN = os.environ.get("LOGGOPSIM_BIN"), os.environ.get("TXT2BIN_BIN")


@pytest.mark.simulator
@pytest.mark.skipif(not (BIN and TXT2BIN and Path(BIN).is_file() and Path(TXT2BIN).is_file()),
                    reason="set LOGGOPSIM_BIN and TXT2BIN_BIN to LogGOPSim's LogGOPSim and txt2bin")
@pytest.mark.parametrize("name", ["pp-zero3", "interleaved", "moe-cp"])
def test_loggopsim_finishes_every_rank(make_set, tmp_path, name):
    _, out, doc = make_set(**SETS[name])
    assert export(out, tmp_path / "g", "--time-unit", "ps").exit_code == 0
    goal, binary = tmp_path / "g" / "workload.goal", tmp_path / "g.bin"
    subprocess.run([TXT2BIN, "-i", str(goal), "-o", str(binary)], check=True, capture_output=True, timeout=600)
    done = subprocess.run([BIN, "-f", str(binary), "-L", "1000000", "-o", "1000", "-g", "1000", "-G", "20"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0
    assert "queue on host" not in done.stdout, done.stdout[-2000:]  # LogGOPSim's report of a stalled schedule
    assert "Times:" in done.stdout or "Maximum finishing time" in done.stdout
    # a rank waits for what it receives: no rank finishes before its own compute is done
    ranks = parse_goal(goal)
    compute = [sum(op[1] for op in g["ops"].values() if op[0] == "calc") for _, g in sorted(ranks.items())]
    times = [int(t) for t in re.findall(r"Host \d+: (\d+)", done.stdout)]
    if len(ranks) > 16:  # LogGOPSim prints only the latest rank beyond 16
        times = [int(re.search(r"Maximum finishing time at host \d+: (\d+)", done.stdout)[1])]
        compute = [max(compute)]
    assert len(times) == len(compute) and all(t >= c for t, c in zip(times, compute, strict=True))


@pytest.mark.simulator
@pytest.mark.skipif(not (BIN and TXT2BIN and Path(BIN).is_file() and Path(TXT2BIN).is_file()),
                    reason="set LOGGOPSIM_BIN and TXT2BIN_BIN to LogGOPSim's LogGOPSim and txt2bin")
def test_loggopsim_carries_time_through_a_dependency(tmp_path):
    """Rank 0 computes 100 us, then sends; rank 1 receives, then computes 10 us: rank 1 cannot
    finish before 110 us. (Operations on a second LogGOPSim cpu would ignore the wait.)"""
    from mutate import comp, recv, send, write_set

    first, second = comp(0), comp(1, deps=[0])
    first.duration_micros, second.duration_micros = 100, 10
    directory = write_set(tmp_path / "s", {0: [first, send(1, 0, 1, 7, deps=[0])],
                                           1: [recv(0, 0, 1, 7), second]}, {})
    assert export(directory, tmp_path / "g").exit_code == 0
    subprocess.run([TXT2BIN, "-i", str(tmp_path / "g" / "workload.goal"), "-o", str(tmp_path / "g.bin")], check=True,
                   capture_output=True, timeout=60)
    done = subprocess.run([BIN, "-f", str(tmp_path / "g.bin")], capture_output=True, text=True, timeout=60)
    times = {int(h): int(t) for h, t in re.findall(r"Host (\d+): (\d+)", done.stdout)}
    assert times[1] >= 110_000, done.stdout
