"""Sharded generation + merge must equal a single run, byte for byte, and refuse incomplete sets."""

import filecmp
import os

import pytest

from traceforge.base.errors import UserError
from traceforge.base.shards import parse_shard
from traceforge.config import build_spec
from traceforge.write.shard import merge_shards, shard_ranks, write_shard
from traceforge.write.writer import write_trace_set

SPEC = dict(tp=2, pp=2, dp=6, num_microbatches=3)


def _same_tree(a, b):
    names_a, names_b = sorted(os.listdir(a)), sorted(os.listdir(b))
    assert names_a == names_b
    for name in names_a:
        assert filecmp.cmp(a / name, b / name, shallow=False), name


@pytest.mark.parametrize("n", [1, 3, 5])
def test_shards_merge_to_the_single_run(tmp_path, n):
    spec = build_spec("demo", overrides=SPEC)
    write_trace_set(spec, tmp_path / "whole")
    for k in reversed(range(n)):  # any order
        write_shard(spec, tmp_path / "sharded", k, n, jobs=2 if k == 0 else 1)
    merge_shards(tmp_path / "sharded")
    _same_tree(tmp_path / "whole", tmp_path / "sharded")


def test_shard_ranks_partition_the_world():
    for world, n in [(24, 5), (8, 8), (7, 3), (16384, 100)]:
        covered = [r for k in range(n) for r in shard_ranks(world, k, n)]
        assert covered == list(range(world))


def test_merge_names_the_missing_shard(tmp_path):
    spec = build_spec("demo", overrides=SPEC)
    write_shard(spec, tmp_path, 0, 3)
    write_shard(spec, tmp_path, 2, 3)
    with pytest.raises(UserError, match=r"shards 1 of 3 are missing"):
        merge_shards(tmp_path)
    assert not (tmp_path / "manifest.json").exists()


def test_merge_refuses_mixed_specs(tmp_path):
    other = build_spec("demo", overrides={**SPEC, "dp_mode": "zero1"})
    write_shard(build_spec("demo", overrides=SPEC), tmp_path, 0, 2)
    with pytest.raises(UserError, match="another spec"):  # refused when written into one folder
        write_shard(other, tmp_path, 1, 2)
    write_shard(other, tmp_path / "elsewhere", 1, 2)
    for path in (tmp_path / "elsewhere").iterdir():  # ... and when copied together afterwards
        path.rename(tmp_path / path.name)
    with pytest.raises(UserError, match="different spec"):
        merge_shards(tmp_path)


def test_rewriting_a_shard_needs_force(tmp_path):
    spec = build_spec("demo", overrides=SPEC)
    write_shard(spec, tmp_path, 0, 2)
    with pytest.raises(UserError, match="--force"):
        write_shard(spec, tmp_path, 0, 2)
    write_shard(spec, tmp_path, 0, 2, force=True)


def test_a_truncated_rank_file_blocks_the_merge(tmp_path):
    spec = build_spec("demo", overrides=SPEC)
    for k in range(2):
        write_shard(spec, tmp_path, k, 2)
    victim = tmp_path / "workload.5.et"
    victim.write_bytes(victim.read_bytes()[:-3])
    with pytest.raises(UserError, match="workload.5.et"):
        merge_shards(tmp_path)


@pytest.mark.parametrize("bad", ["3/3", "1", "a/b", "-1/2", "0/0"])
def test_bad_shard_argument(bad):
    with pytest.raises(UserError, match="--shard"):
        parse_shard(bad)
