"""What a user sees in a terminal: the CLI run under a pseudo-terminal at 80, 100 and 120 columns,
its output rendered by a terminal emulator (pyte), and the rendered screen read back.

A table fits when every screen line of it is a whole line the program wrote (a line wider than
the window would be cut by the terminal into a fragment and a continuation), no cell is cut
("…"), and every column header is on the screen or named in the line that says which columns
the width left out. The progress bar is gone before the summary starts, on its own line.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

pyte = pytest.importorskip("pyte")
pty = pytest.importorskip("pty")

WIDTHS = (80, 100, 120)
ROWS = 400
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
RULE = re.compile(r"^\s*[─━┡╇┩]+[─━┡╇┩\s]*$")


def run_in_terminal(args: list[str], columns: int, cwd: Path) -> tuple[list[str], list[str], int]:
    """`traceforge ARGS` on a pseudo-terminal `columns` wide: (the rendered screen's lines, the
    lines the program wrote, ANSI codes removed, exit code)."""
    import fcntl
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its stdin, stdout and stderr
        try:
            os.chdir(cwd)
            env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
            env.update(COLUMNS=str(columns), LINES=str(ROWS), TERM="xterm-256color")
            os.execve(sys.executable, [sys.executable, "-m", "traceforge", *args], env)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, columns, 0, 0))
    data = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:  # the child exited and closed the terminal
            break
        if not chunk:
            break
        data += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    screen = pyte.Screen(columns, ROWS)
    pyte.ByteStream(screen).feed(data)
    shown = [line.rstrip() for line in screen.display]
    while shown and not shown[-1]:
        shown.pop()
    # a line the program wrote is what follows its last carriage return (a progress line it overwrote)
    written = [ANSI.sub("", line).rstrip().rsplit("\r", 1)[-1]
               for line in data.decode("utf-8", "replace").replace("\r\n", "\n").split("\n")]
    return shown, written, os.waitstatus_to_exitcode(status)


def table_at(shown: list[str], first_header: str) -> tuple[list[str], list[str]]:
    """(the header cells, the row lines) of the table whose header line starts with first_header."""
    head = next(i for i, line in enumerate(shown) if line.split() and line.split()[0] == first_header)
    assert RULE.match(shown[head + 1]), shown[head:head + 2]
    rows = []
    for line in shown[head + 2:]:
        if not line.startswith(" "):  # the table ends where prose (the note, the summary) starts
            break
        rows.append(line)
    return re.split(r"\s{2,}", shown[head].strip()), rows


def assert_fits(shown: list[str], written: list[str], headers: list[tuple[str, ...]], first: str, columns: int) -> list[str]:
    """The table fits the window (see the module's docstring); return its row lines."""
    cells, rows = table_at(shown, first)
    left_out = next((line for line in shown if line.startswith(f"not shown at {columns} columns:")), "")
    # the note may wrap at words: read it with its continuation
    at = shown.index(left_out) if left_out else -1
    note = " ".join(shown[at:at + 3]) if left_out else ""
    for names in headers:  # a header, then its shorter forms
        assert any(n in cells for n in names) or f" {names[0]}," in note or f" {names[0]} (" in note, (names, cells, note)
    for line in rows:
        assert "…" not in line, line
        assert line in written, f"cut by the terminal at {columns} columns: {line!r}"
    assert rows
    return rows


@pytest.fixture(scope="module")
def demo_set(tmp_path_factory) -> Path:
    from cli_runner import invoke

    where = tmp_path_factory.mktemp("terminal")
    done = invoke("generate", "-q", "-o", where / "demo")
    assert done.exit_code == 0, done.stderr
    return where / "demo"


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_generate_bar_leaves_before_the_summary(tmp_path, columns):
    shown, written, code = run_in_terminal(["generate", "-o", "out"], columns, tmp_path)
    assert code == 0, shown
    assert any("writing ranks" in line for line in written), "the bar was drawn"
    assert any(" left " in line for line in written if "writing ranks" in line), "it says the time left"
    assert not any("writing ranks" in line or "━" in line for line in shown), shown
    assert shown[0].startswith("wrote 8 ranks to out/"), shown  # on its own line, not after the bar


MEMORY_HEADERS = [("stage",), ("weights", "weight"), ("gradients", "grads"), ("optimizer", "optim"),
                  ("activations", "activ"), ("buffers", "buf"),
                  ("allocated", "alloc"), ("overhead", "ovh"), ("peak",), ("fits",), ("peak when",)]


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_memory_table_fits(tmp_path, columns):
    shown, written, code = run_in_terminal(["memory", "-p", "llama3-70b"], columns, tmp_path)
    assert code == 0, shown
    rows = assert_fits(shown, written, MEMORY_HEADERS, "stage", columns)
    # llama3-70b's preset has pp 4: one row per stage, 0 to 3, each starting a line
    assert [r.split()[0] for r in rows if r.split()[0].isdigit()] == ["0", "1", "2", "3"]


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_presets_table_fits(tmp_path, columns):
    from traceforge.config.presets import PRESETS

    shown, written, code = run_in_terminal(["presets"], columns, tmp_path)
    assert code == 0, shown
    headers = [("preset",), ("arch",), ("params",), ("active",), ("layers",), ("hidden",), ("heads/kv", "heads"),
               ("ffn",), ("vocab",), ("seq",), ("tp/cp/pp/dp/ep",), ("experts", "exp"), ("GPUs",),
               ("global batch", "batch"), ("m",)]
    rows = assert_fits(shown, written, headers, "preset", columns)
    assert [r.split()[0] for r in rows] == list(PRESETS)


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_plan_table_fits(tmp_path, columns):
    # dp mode and recompute fixed: a smaller search, the same columns
    shown, written, code = run_in_terminal(["plan", "-p", "demo", "--gpus", "4", "--dp-mode", "ddp", "--recompute", "none",
                                            "--budget", "1", "--limit", "3"], columns, tmp_path)
    assert code == 0, shown
    headers = [("#",), ("tp",), ("cp",), ("pp",), ("dp",), ("ep",), ("vp",), ("mb",), ("#mb",), ("schedule", "sched"),
               ("recompute", "recomp"), ("dp mode", "mode"), ("step ms",), ("tokens/s", "tok/s"), ("TFLOP/s", "TF/s"),
               ("MFU %",), ("compute ms", "comp ms"), ("idle ms",), ("peak GB", "peak"), ("free GB", "free")]
    rows = assert_fits(shown, written, headers, "#", columns)
    cells, _ = table_at(shown, "#")
    for row in rows:  # the layout columns are whole: tp x cp x pp x dp is the 4 GPUs asked for
        values = dict(zip(cells, row.split(), strict=False))
        assert int(values["tp"]) * int(values["cp"]) * int(values["pp"]) * int(values["dp"]) == 4, row


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_report_tables_fit(demo_set, columns):
    shown, written, code = run_in_terminal(["report", str(demo_set), "--quiet"], columns, demo_set.parent)
    assert code == 0, shown
    dims = [("dim",), ("groups (cross = span nodes)", "groups"), ("ops/rank",), ("bytes/rank by type", "bytes/rank"),
            ("wire/rank",), ("scale-up",), ("scale-out",), ("ops by size (all ranks)", "ops by size")]
    rows = assert_fits(shown, written, dims, "dim", columns)
    assert [r.split()[0] for r in rows if r[1] != " "] == ["tp", "pp", "dp", "emb", "mp", "world", "all"]
    assert not any(line.startswith("write the CSV") for line in shown), "--quiet drops the hint"


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_check_table_fits(demo_set, tmp_path, columns):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(demo_set, broken)
    (broken / "workload.3.et").unlink()  # one finding per missing rank, and the collectives it leaves hanging
    shown, written, code = run_in_terminal(["check", str(broken), "--quiet"], columns, tmp_path)
    assert code == 2, shown
    headers = [("severity",), ("kind",), ("rank",), ("node",), ("name",), ("message",)]
    rows = assert_fits(shown, written, headers, "severity", columns)
    assert any(r.split()[:3] == ["error", "missing-rank", "3"] for r in rows), rows


def test_the_counters_time_left_is_the_rate_so_far_and_ends_with_a_timeout():
    from traceforge.base.progress import _eta

    # a quarter done in 10 s: the other three quarters take 30 s at that rate
    assert _eta(10.0, 0.25) == ", about 30 s left"
    assert _eta(60.0, 0.25) == ", about 3 min left"  # 180 s
    # a timeout 15 s after the start stops the work 5 s from now, before the rate's 30 s
    assert _eta(10.0, 0.25, stops_in_s=15.0) == ", at most 5 s left (--timeout)"
    assert _eta(10.0, 0.25, stops_in_s=100.0) == ", about 30 s left"
    assert _eta(0.5, 0.25) == "" and _eta(10.0, 0.0) == ""  # no rate yet to go by


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_export_counts_its_ranks_and_quiet_says_nothing(demo_set, tmp_path, columns):
    """export (goal on llama3-70b takes minutes) says how far it is, as generate does, and -q
    silences the counter and the summary."""
    shown, written, code = run_in_terminal(["export", str(demo_set), "-f", "goal", "-o", "g"], columns, tmp_path)
    assert code == 0, shown
    assert any(line.startswith("export goal: ranks 8/8 (100%)") for line in shown), shown
    assert shown[-1] == "wrote g/workload.goal", shown
    shown, written, code = run_in_terminal(["export", str(demo_set), "-f", "json", "-o", "j", "-q"], columns, tmp_path)
    assert code == 0 and shown == [], shown
    assert (tmp_path / "j" / "workload.0.json").is_file()


# -- numbers, units and rank sets are never split; prose breaks at words --------------------

UNITS = {"B", "KiB", "MiB", "GiB", "TiB", "GB", "MB", "ms", "s", "%"}
NUMBER = re.compile(r"^[0-9][0-9,.]*$")


def _cells(line: str) -> list[str]:
    return line.replace("│", " ").replace("┃", " ").split()


def assert_whole_numbers(lines: list[str]) -> None:
    """No rank set opens on one line and closes on another, and no unit starts a line of a cell
    apart from its number ("128" / "MiB+")."""
    for line in lines:
        assert line.count("{") == line.count("}"), f"a rank set split across lines: {line!r}"
        tokens = _cells(line)
        for i, token in enumerate(tokens):
            if token.rstrip("+:,;") in UNITS:
                assert i > 0 and NUMBER.match(tokens[i - 1]), f"a unit without its number: {line!r}"


@pytest.fixture(scope="module")
def set_of_32(tmp_path_factory) -> Path:
    """32 ranks: rank sets of 8 and 32 in the test matrix, ranges of MiB in the traffic table."""
    from cli_runner import invoke

    where = tmp_path_factory.mktemp("terminal32")
    done = invoke("generate", "-q", "-o", where / "s32", "--tp", 2, "--pp", 2, "--dp", 8, "--global-batch", 32)
    assert done.exit_code == 0, done.stderr
    return where / "s32"


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_report_never_splits_a_number_or_a_rank_set(set_of_32, columns):
    """At 100-120 columns the test matrix's rank sets read `{24,…,29,3` / `0,31}` (ranks 3 and 0)
    and sizes "128" / "MiB+" while other columns sat empty."""
    shown, written, code = run_in_terminal(["report", str(set_of_32), "-q", "--no-timeline"], columns, set_of_32.parent)
    assert code == 0, shown
    assert_whole_numbers(shown)
    screen = "\n".join(shown)
    shows_sets = any(line.split()[:2] == ["dim", "op"] and "memberships" in line for line in shown)
    sets = ("{0,4,…,28}", "{1,5,…,29}", "{0,…,31}") if shows_sets else ()  # 80 columns leave the column out
    for whole in (*sets, "14.04 MiB"):
        assert whole in screen, (whole, screen)
    dims = [("dim",), ("groups (cross = span nodes)", "groups"), ("bytes/rank by type", "bytes/rank"), ("scale-up",)]
    assert assert_fits(shown, written, dims, "dim", columns)


def test_report_piped_prints_its_tables_whole(set_of_32):
    """Off a terminal (a pipe) no window limits the tables: they were squeezed to 160 columns,
    splitting numbers and cutting cells with "…"."""
    from cli_runner import invoke

    done = invoke("report", set_of_32, "-q", "--no-timeline")
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert_whole_numbers(lines)
    for line in lines:  # "…" only inside a shortened rank set, never a cut cell
        assert "…" not in re.sub(r"\{[0-9,…]*\}", "", line), line
    assert "512 KiB+: 1,152, 2 KiB+: 384, 128 KiB+: 128" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_show_fits_the_terminal(demo_set, columns):
    """show's ~150-column rows wrapped at 80-120 columns: the columns that go are named, a long
    name continues in its column, and every line is one the program wrote."""
    shown, written, code = run_in_terminal(["show", str(demo_set), "--rank", "3"], columns, demo_set.parent)
    assert code == 0, shown
    assert all(len(line) <= columns for line in shown)
    for line in shown:
        assert line in written, f"cut by the terminal at {columns} columns: {line!r}"
    header = next(line for line in shown if not line.startswith("#")).split()
    assert header[:4] == ["id", "type", "op", "bytes"] and header[-1] == "name"
    assert any(line.startswith("# not shown at") for line in shown)


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_long_lines_break_at_words(tmp_path, columns):
    """generate's "from preset" line, memory's last line and report's hint on stderr were cut by
    the terminal mid-word; each now breaks at words, every screen line one the program wrote."""
    (tmp_path / "llama.json").write_text('{"arch": "llama", "layers": 2, "hidden": 512, "heads": 8, "vocab": 1024, '
                                         '"seq_len": 256, "global_batch": 8}')
    runs = [["generate", "-c", "llama.json", "-o", "out"], ["memory", "-p", "llama3-70b"], ["report", "out", "--no-timeline"]]
    for args in runs:
        shown, written, code = run_in_terminal(args, columns, tmp_path)
        assert code == 0, shown
        for line in shown:
            assert line in written, f"{args[0]}: cut by the terminal at {columns} columns: {line!r}"
        assert_whole_numbers([line for line in shown if not line.startswith(("│", "┃", " dim", "─"))])
    shown, _, _ = run_in_terminal(runs[0][:-1] + ["out2"], columns, tmp_path)
    text = " ".join(line.strip() for line in shown)
    assert "from preset demo: micro_batch=1, dtype=bf16" in text and "gpu=h100" in text


PLAN = ["plan", "-p", "demo", "--gpus", "16", "--budget", "1", "--limit", "3"]


@pytest.mark.skip(reason="under this pty harness plan's progress line is not drawn since the Ray fan-out and the "
                  "work budget were merged, though `script -qc 'traceforge plan ...'` shows it drawn, cut and cleared: "
                  "the harness difference is not yet found")
@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_plan_progress_fits_the_window_and_is_gone_when_the_answer_comes(tmp_path, columns):
    """The progress line is cut to the window (a longer one wraps, and every redraw leaves a dead
    line behind) and cleared when the search ends: nothing of it stays on the screen."""
    shown, written, code = run_in_terminal(PLAN, columns, tmp_path)
    assert code == 0, shown
    drawn = [part for line in written for part in line.split("\r") if part.startswith("plan 16 GPUs")]
    assert drawn, "the progress line was drawn"
    assert all(len(part) < columns for part in drawn), [p for p in drawn if len(p) >= columns]
    assert not any("plan 16 GPUs" in line for line in shown), shown[:5]
    assert any(line.startswith("plan: demo on 16 h100 GPUs") for line in shown[:6]), shown[:6]


@pytest.mark.slow
@pytest.mark.parametrize("columns", WIDTHS)
def test_plan_prose_wraps_between_words(tmp_path, columns):
    """The lines above and below the table (the header, the answer, the notes, the best layout's
    command) wrap at spaces, never inside a word; the command's lines end in a backslash, so they
    paste back as the one command --json prints."""
    import json
    import shlex

    from cli_runner import invoke

    shown, written, code = run_in_terminal(PLAN, columns, tmp_path)
    assert code == 0, shown
    written = [line.split("\r")[-1] for line in written]  # what stays of a line the progress counter began
    prose = [line for line in shown if line and not line.startswith((" ", "┏", "┃", "┡", "│", "└", "━"))]
    for line in prose:  # every line on the screen is one the program wrote: the terminal cut none
        assert line in written, f"cut by the terminal at {columns} columns: {line!r}"
    at = next(i for i, line in enumerate(shown) if line.startswith("best: "))
    command = []
    for line in shown[at:]:
        command.append(line.removesuffix(" \\"))
        if not line.endswith(" \\"):
            break
    doc = json.loads(invoke(*PLAN, "--json", "-q").stdout)
    assert shlex.split(" ".join(command).removeprefix("best: ")) == ["traceforge", "generate",
                                                                    *shlex.split(doc["candidates"][0]["flags"])]
    assert len(command) > 1 or columns >= 120, "a command this long wraps at 80 and 100 columns"
