"""The 131,072-GPU case end to end: generate, check, report; one row per step.

    python benchmarks/bench_131k.py                      # llama3-405b-131072gpu: t8 p16 d1024, ~27 GB
    python benchmarks/bench_131k.py --dp 128             # the same model and schedule on 16,384 ranks
    python benchmarks/bench_131k.py --steps generate     # only some steps (generate,check,report,diff)
    python benchmarks/bench_131k.py --dp 128 --steps generate,diff   # diff of the set and its cp -r copy
    python benchmarks/bench_131k.py --timeline-70b       # also: full 128-rank llama3-70b timeline
    python benchmarks/bench_131k.py --set /work/big/s131k --steps check,report   # an existing set, not rewritten

Every step runs the CLI in a fresh child process: `wall s` is the command inside it, `cpu s` its
user+sys time and its workers' (on a shared machine CPU time is steadier than wall), `RSS MB`
the peak of the child and of its largest worker. dd's wall and CPU are printed beside ours. Generate is compared, in the same run, with
`cp -r` of its own output and with `dd` writing the same number of bytes as one sequential file
and syncing it (`conv=fsync`: the disk's speed, not the page cache's; `ours/dd`: our MB/s over
dd's, `time ours/dd` the goal's ratio, dd run first and deleted before generating; `cp/ours`:
cp's time over ours, skipped when the disk lacks room for a second copy). report, check and diff
are compared with a cold read of what they read (`find DIR -type f -exec cat`, after dropping
those files, and only those, from the page cache with posix_fadvise), measured just before each;
each reads the set cold as well.
Everything written is deleted at the end, and the run refuses to start, in one line,
when the scratch disk lacks the room it needs (the set, plus its copy for `cp -r`). The load
average is printed beside every row: on a shared machine it explains most of the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESET = "llama3-405b-131072gpu"
BYTES_PER_RANK = 340_000  # about 44 GB / 131,072 ranks since the preset took SP and the distributed optimizer (benchmarks/README.md)
MARGIN = 10 << 30  # left free for everyone else on a shared disk
STEPS = ("generate", "report", "check", "diff")  # diff needs the copy cp -r makes


def _child(args: list[str]) -> None:
    """Run one traceforge command here, stdout discarded; print wall time and peak RSS as JSON."""
    from traceforge.cli import app, load_commands

    load_commands()
    keep = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    started = time.perf_counter()
    code = 0
    try:
        app(args, prog_name="traceforge")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    wall = time.perf_counter() - started
    os.dup2(keep, 1)
    peak_kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in usage)
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_mb": peak_kb / 1024, "exit": code}))


def run_child(args: list[str]) -> dict:
    started = time.perf_counter()
    stdout, stderr, code = _run(["nice", sys.executable, __file__, "--child", json.dumps(args)])
    if code:
        sys.exit(f"bench_131k: traceforge {' '.join(args)} failed: {stderr.strip()[-500:]}")
    figures = json.loads(stdout.strip().splitlines()[-1])
    figures["command"] = time.perf_counter() - started
    return figures


def timed(command: list[str]) -> tuple[float, float]:
    """(wall s, user+sys CPU s) of command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    _, _, code = _run(["nice", *command])
    if code:
        sys.exit(f"bench_131k: {' '.join(command)} failed")
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def _run(command: list[str]) -> tuple[str, str, int]:
    """Run command in its own process group, so an interrupted benchmark stops it and every
    worker it started before deleting the scratch directory."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return stdout, stderr, proc.returncode


def _interrupted(signum, frame) -> None:
    sys.exit(f"bench_131k: stopped by signal {signum}; scratch files removed")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dp", type=int, default=1024, help="Data-parallel size (1024: 131,072 ranks).")
    parser.add_argument("--steps", default="generate,report,check", help="Comma-separated subset of generate,report,check,diff "
                        "(diff compares the set with its cp -r copy: twice the space).")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="Scratch directory.")
    parser.add_argument("--no-copy", action="store_true", help="Skip the cp -r comparison (half the space).")
    parser.add_argument("--no-dd", action="store_true", help="Skip the dd comparison.")
    parser.add_argument("--set", type=Path, help="Run check/report on this existing set (read only; no generate).")
    parser.add_argument("--timeline-70b", action="store_true", help="Also time the full 128-rank llama3-70b timeline.")
    opts = parser.parse_args()
    steps = [s for s in opts.steps.split(",") if s]
    if any(s not in STEPS for s in steps):
        sys.exit(f"bench_131k: --steps takes a subset of {','.join(STEPS)}, got {opts.steps!r}")
    ranks = 8 * 16 * opts.dp
    if opts.set is not None:
        if not (opts.set / "manifest.json").is_file():
            sys.exit(f"bench_131k: --set {opts.set} has no manifest.json: give a trace set's directory")
        ranks = json.loads((opts.set / "manifest.json").read_text())["world_size"]
        steps = [s for s in steps if s != "generate"]
    size = ranks * BYTES_PER_RANK
    need = size * (1 if opts.no_copy else 2) + MARGIN
    free = shutil.disk_usage(opts.dir).free
    if opts.set is None and free < need:
        sys.exit(f"bench_131k: needs {need / 1e9:.1f} GB free in {opts.dir} ({ranks:,} ranks, ~{size / 1e9:.1f} GB "
                 f"{'' if opts.no_copy else 'plus its copy for cp -r '}); it has {free / 1e9:.1f} GB: "
                 "free space, choose --dir, or pass --no-copy or a smaller --dp")
    signal.signal(signal.SIGTERM, _interrupted)  # so a killed run still deletes what it wrote
    base = Path(tempfile.mkdtemp(prefix="tf-bench-131k-", dir=opts.dir))
    out = opts.set if opts.set is not None else base / "set"
    rows: list[tuple[str, dict]] = []
    try:
        # 16 micro-batches each; --allow-oom: a small --dp shards the optimizer over fewer GPUs than the
        # preset, which the memory gate refuses, and the bytes written are the same either way.
        spec = ["-p", PRESET, "--dp", str(opts.dp), "--global-batch", str(16 * opts.dp), "--allow-oom"]
        if opts.set is None:  # every later step reads the set the generate step writes
            dd = None
            if not opts.no_dd:  # first, and deleted at once: the set and this file never coexist
                blocks = -(-size // (16 << 20))
                dd = (blocks * (16 << 20), *timed(["dd", "if=/dev/zero", f"of={base / 'dd.bin'}", "bs=16M",
                                                    f"count={blocks}", "conv=fsync"]))
                (base / "dd.bin").unlink()
            fig = run_child(["generate", *spec, "-o", str(out), "-q"])
            fig["bytes"] = du(out)
            fig["load"] = load()
            if dd is not None:
                fig["dd_MBps"], fig["dd_wall"], fig["dd_cpu"] = dd[0] / 1e6 / dd[1], dd[1], dd[2]
            if not opts.no_copy:
                if shutil.disk_usage(base).free < fig["bytes"] + MARGIN:
                    print(f"bench_131k: no room to copy {fig['bytes'] / 1e9:.1f} GB for cp -r; skipped", flush=True)
                else:
                    fig["cp"] = timed(["cp", "-r", str(out), str(base / "copy")])[0]
                    if "diff" not in steps:
                        shutil.rmtree(base / "copy")
            rows.append(("generate", fig))
            print_row(rows[-1], ranks)
        for step in ("report", "check"):
            if step in steps:
                cold = cold_read([out])
                evict([out])
                fig = run_child(["report", str(out), "-o", str(base / "report")] if step == "report" else ["check", str(out)])
                fig["load"], fig["cold_read"] = load(), cold
                rows.append((step, fig))
                print_row(rows[-1], ranks)
        if "diff" in steps and (base / "copy").is_dir():
            cold = cold_read([out, base / "copy"])
            evict([out, base / "copy"])
            fig = run_child(["diff", str(out), str(base / "copy")])
            fig["load"], fig["cold_read"] = load(), cold
            rows.append(("diff", fig))
            print_row(rows[-1], ranks)
            shutil.rmtree(base / "copy")
        if opts.timeline_70b:
            l70 = base / "l70"
            run_child(["generate", "-p", "llama3-70b", "-o", str(l70), "-q"])
            fig = run_child(["report", str(l70), "--timeline-ranks", "all", "-o", str(base / "r70")])
            fig["bytes"] = (base / "r70" / "timeline.json").stat().st_size
            fig["load"] = load()
            rows.append(("timeline-70b-all", fig))
            print_row(rows[-1], 128)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def evict(directories: list[Path]) -> None:
    """Drop these files (only these: the machine is shared) from the page cache, so the next
    reader reads them from the disk."""
    for directory in directories:
        for path in directory.iterdir():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cold_read(directories: list[Path]) -> float:
    """Seconds `cat` takes to read every file of these sets from the disk: the reference for
    check, report (one set) and diff (two)."""
    evict(directories)
    command = ["sh", "-c", " ; ".join(f"find {d} -type f -exec cat {{}} + > /dev/null" for d in directories)]
    return timed(command)[0]


def print_row(row: tuple[str, dict], ranks: int) -> None:
    name, f = row
    text = (f"{name:17} ranks {ranks:>7,}  wall {f['wall']:8.1f} s  cpu {f['cpu']:8.1f} s  cmd {f['command']:8.1f} s"
            f"  RSS {f['peak_mb']:6.0f} MB"
            f"  {ranks / f['wall']:8.0f} ranks/s")
    if "bytes" in f:
        text += f"  {f['bytes'] / 1e9:6.2f} GB  {f['bytes'] / 1e6 / f['wall']:6.0f} MB/s"
    if "dd_MBps" in f:
        ours = f["bytes"] / 1e6 / f["wall"]
        text += (f"  dd {f['dd_MBps']:.0f} MB/s, {f['dd_wall']:.1f} s wall, {f['dd_cpu']:.1f} s cpu"
                 f" (ours/dd {ours / f['dd_MBps']:.2f}; time ours/dd {f['wall'] / f['dd_wall']:.2f})")
    if "cold_read" in f:
        text += f"  cold read {f['cold_read']:.1f} s (ours/read {f['wall'] / f['cold_read']:.2f})"
    if "cp" in f:
        text += f"  cp -r {f['cp']:.1f} s (cp/ours {f['cp'] / f['wall']:.2f})"
    text += f"  exit {f['exit']}  load {f['load']}"
    print(text, flush=True)


if __name__ == "__main__":
    main()
