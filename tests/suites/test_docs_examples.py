"""Every command the docs show still runs as shown, every flag they name exists, every module
path they name is there: docs that cannot drift.

What counts as an example: the command lines of ```sh blocks and the `$ ` lines of ```console
blocks in README.md, CONTRIBUTING.md, benchmarks/README.md and docs/*.md; `&&` splits a line
into commands. Each block runs in an empty temporary folder of its own, its commands in order.

The rule for what is run and what is only parsed (one rule, no per-example exceptions):

- a `traceforge` command is always parsed by the CLI's own parser (click, as vendored by typer): every flag exists,
  every value converts, every choice is legal; `generate`'s spec is then built and validated by
  the same `build_spec` the command uses, so an impossible combination fails here;
- it is also *run* in process (tests/cli_runner.py) and must exit 0, unless it
  - writes more than RUN_MAX_RANKS ranks (`generate -p llama3-405b`: parsed and validated only),
  - needs what traceforge does not ship (`simulate`'s simulator, `calibrate`'s PyTorch and GPU,
    anything with `--astra-sim-bin`, or with `--ray`: a Ray cluster),
  - names a placeholder (an upper-case word such as DIR, `$VAR` not in ENV_VALUES, /path/to,
    or an absolute path, which is outside the temporary folder), or
  - names a path an earlier parsed-only example would have written;
- a trace-set argument that does not exist yet (and no earlier example would have made) is the
  demo set, written there first: the docs presume the reader ran the quick start (`traces/`);
  the spec files they use are the repository's `examples/`, seen from each block's folder;
- the output a console block shows under a command must be what it prints (`...` stands for
  any lines; a duration such as `0.01 s` for any duration);
- `python FILE.py [flags]` (benchmarks, scripts): the file exists and every flag shown is in its
  `--help`; it is not run (benchmarks take minutes by design);
- any other program must be in EXTERNAL (pip, ruff, a simulator): a new one fails the test, so
  adding one is a decision made here.

Inline code spans (`traceforge report --timeline-ranks all`) are not run, but each of their
`--flags` must exist on the command they name; and every `traceforge/...`, `plan/...`,
`tests/...` path the docs name, and every bare `name.py` inside a paragraph or table that names
its folder (`plan/` ... `schedules.py`), must exist.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from typer.core import TyperArgument, TyperGroup

from tests.cli_runner import invoke
from traceforge.cli import app, load_commands

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md",
               *(ROOT / "docs").glob("*.md")])
RUN_MAX_RANKS = 16
ENV_VALUES = {"SLURM_ARRAY_TASK_ID": "0"}
# The spec files the docs use are the repository's examples/ (each block's folder sees it as
# examples/); a file the docs name that is not there fails the example that reads it.
EXAMPLES = ROOT / "examples"
# Programs the docs show that traceforge does not ship; they are not run.
EXTERNAL = {".", "pip", "python3", "ruff", "mypy", "lint-imports", "cd", "mkdir", "txt2bin", "LogGOPSim", "./bin/SimAI_analytical",
            "git", "export", "torchrun",  # these three: installing and running PARAM (docs/replay.md)
            "ray"}  # starting a Ray cluster (docs/scale.md)
PYTHON_EXTERNAL_MODULES = {"pytest", "grpc_tools.protoc", "venv"}
# Commands that need what traceforge does not ship (a simulator binary; PyTorch and a GPU; a Ray
# cluster): parsed, never run.
NEEDS_BINARY = {"simulate", "calibrate"}
BINARY_FLAGS = {"--astra-sim-bin", "--ray"}

load_commands()
CLI = typer.main.get_command(app)
assert isinstance(CLI, TyperGroup)


@dataclass
class Example:
    doc: Path
    line: int
    text: str
    block: int = 0  # the block's number in its document
    output: list[str] = field(default_factory=list)  # what a console block shows under it

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.text}"


def examples(doc: Path) -> list[Example]:
    """The commands of a document's sh and console blocks, in order."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    kind, i, block = None, 0, 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("```"):
            kind = None if kind else (stripped[3:].strip() or "text")
            block += 1
            i += 1
            continue
        if kind == "sh" and stripped and not stripped.startswith("#"):
            start, text = i + 1, stripped
            while text.endswith("\\"):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            found += [Example(doc, start, part, block) for part in split_and(text)]
        elif kind == "console" and stripped.startswith("$ "):
            found += [Example(doc, i + 1, part, block) for part in split_and(stripped[2:])]
        elif kind == "console" and found and found[-1].block == block:
            found[-1].output.append(lines[i].rstrip())
        i += 1
    return found


def split_and(text: str) -> list[str]:
    words = shlex.split(text, comments=True)
    parts, current = [], []
    for word in words:
        if word == "&&":
            parts.append(current)
            current = []
        else:
            current.append(word)
    parts.append(current)
    return [shlex.join(p) for p in parts if p]


def all_examples() -> list[Example]:
    return [e for doc in DOCS for e in examples(doc)]


def expand_env(word: str) -> str | None:
    """ENV_VALUES substituted; None when a $VAR remains (a placeholder the reader fills in)."""
    for name, value in ENV_VALUES.items():
        word = word.replace("$" + name, value)
    return None if "$" in word else word


PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(/|$)")


def is_placeholder(word: str) -> bool:
    return bool(PLACEHOLDER.match(word)) or "/path/to" in word or word.startswith("/")


def parse(argv: list[str]) -> tuple[Any, Any]:
    """The subcommand and its parsed context, exactly as the CLI would parse argv; raises click's
    usage error on an unknown flag or a bad value."""
    name, *rest = argv
    command = CLI.get_command(typer.Context(CLI), name)
    if command is None:
        raise ValueError(f"no command {name!r}")
    # Placeholders parse as what they stand for; a value they cannot take is not the docs' fault.
    return command, command.make_context(name, rest, resilient_parsing=False)


def positional_paths(command: Any, ctx: Any) -> list[str]:
    paths = []
    for param in command.params:
        if isinstance(param, TyperArgument):
            value = ctx.params.get(param.name or "")
            values = value if isinstance(value, (list, tuple)) else [value]
            paths += [str(v) for v in values if v is not None]
    return paths


def out_path(ctx: Any) -> str | None:
    value = ctx.params.get("out_dir", ctx.params.get("out"))
    return str(value) if value is not None else None


def touches(words: list[str], planned: set[str]) -> bool:
    """A word names a planned path or a path below one."""
    return any(w == p or w.startswith(p.rstrip("/") + "/") for w in words for p in planned)


def generate_world_size(ctx: Any) -> int:
    """Build and validate the spec as `generate` does (the impossible is refused here too)."""
    from traceforge.config import FIELDS, build_spec, load_config_file

    config = load_config_file(ctx.params["config"]) if ctx.params.get("config") else None
    names = {f.name for f in FIELDS}
    overrides = {k: v for k, v in ctx.params.items() if k in names and v is not None}
    if isinstance(overrides.get("straggler"), tuple):
        overrides["straggler"] = list(overrides["straggler"])
    return build_spec(ctx.params.get("preset"), config, overrides).world_size


DURATION = re.compile(r"\d+(\.\d+)? s\b")


def check_output(example: Example, printed: str) -> None:
    """The lines a console block shows are the ones printed; `...` is any number of lines."""
    shown = [DURATION.sub("<t> s", line).rstrip() for line in example.output if line.strip()]
    actual = [DURATION.sub("<t> s", line).rstrip() for line in printed.splitlines() if line.strip()]
    at, skipping = 0, False
    for line in shown:
        if line.strip() == "...":
            skipping = True
            continue
        while skipping and at < len(actual) and actual[at] != line:
            at += 1
        assert at < len(actual) and actual[at] == line, (
            f"{example.where}\n  shows:  {line!r}\n  prints: {actual[at] if at < len(actual) else '(nothing more)'!r}")
        at, skipping = at + 1, False
    assert skipping or at == len(actual) or not shown, (
        f"{example.where}\n  prints more than it shows (end the block with '...'): {actual[at]!r}")


class Block:
    """One block's examples, run in order in one folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.planned: set[str] = set()  # what parsed-only examples would have written
        self.ran = self.parsed = 0

    def run(self, example: Example) -> None:
        words = shlex.split(example.text)
        program = words[0]
        if program == "traceforge":
            self.traceforge(example, words[1:])
        elif program == "python" and len(words) > 1 and words[1].endswith(".py"):
            self.python_file(example, words[1], words[2:])
        elif program == "python" and words[1:2] == ["-m"]:
            assert words[2] in PYTHON_EXTERNAL_MODULES, f"{example.where}: python -m {words[2]} is not a module we know"
            self.parsed += 1
        elif program == "cat":
            assert not example.output or len(words) == 2, example.where
            text = (self.folder / words[1]).read_text(encoding="utf-8")
            check_output(example, text)
            self.ran += 1
        elif program in EXTERNAL or (program.endswith(".sh") and touches([program], self.planned | {program})):
            self.parsed += 1
        else:
            raise AssertionError(f"{example.where}: {program!r} is neither traceforge nor in EXTERNAL; "
                                 "add it to EXTERNAL if the docs mean to show another program")

    def python_file(self, example: Example, script: str, args: list[str]) -> None:
        assert (ROOT / script).is_file(), f"{example.where}: {script} does not exist"
        missing = sorted(f for f in flags_in(args) if not known_flag(f, script_flags(script)))
        assert not missing, f"{example.where}: {script} has no {missing}"
        self.parsed += 1

    def traceforge(self, example: Example, argv: list[str]) -> None:
        expanded = [expand_env(w) for w in argv]
        runnable = None not in expanded
        argv = [w if w is not None else "0" for w in expanded]
        try:
            command, ctx = parse(argv)
        except Exception as exc:  # click's usage errors (typer vendors click)
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            raise AssertionError(f"{example.where}: {message}") from None
        name = argv[0]
        if any(is_placeholder(w) for w in argv[1:]):
            runnable = False
        if name in NEEDS_BINARY or BINARY_FLAGS & set(argv):
            runnable = False
        if touches(argv[1:], self.planned):
            runnable = False
        if name == "generate" and runnable is not False:
            os.chdir(self.folder)
            try:
                runnable = generate_world_size(ctx) <= RUN_MAX_RANKS
            except Exception as exc:
                raise AssertionError(f"{example.where}: the spec is refused: {exc}") from None
        if not runnable:
            self.planned |= set(positional_paths(command, ctx))
            if out_path(ctx):
                self.planned.add(out_path(ctx) or "")
            self.parsed += 1
            return
        for path in positional_paths(command, ctx):  # the demo set the quick start leaves
            if not (self.folder / path).exists():
                assert invoke("generate", "-q", "-o", path).exit_code == 0
        result = invoke(*argv)
        assert result.exit_code == 0, f"{example.where}: exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
        check_output(example, result.stdout)
        self.ran += 1


@pytest.mark.slow  # runs every example, plans included
@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_example_runs_as_shown(doc, tmp_path, monkeypatch):
    found = examples(doc)
    ran = parsed = 0
    for number in sorted({e.block for e in found}):
        folder = tmp_path / f"block{number}"
        folder.mkdir()
        (folder / "examples").symlink_to(EXAMPLES)
        monkeypatch.chdir(folder)
        block = Block(folder)
        for example in found:
            if example.block == number:
                block.run(example)
        ran, parsed = ran + block.ran, parsed + block.parsed
    assert ran + parsed == len(found)
    print(f"{doc.relative_to(ROOT)}: {ran} examples run, {parsed} parsed only")


def test_the_docs_show_examples_and_most_of_them_run():
    """The extraction finds the commands at all (a broken fence parser would pass everything)."""
    found = all_examples()
    traceforge = [e for e in found if e.text.startswith("traceforge ")]
    assert len(traceforge) >= 20, len(traceforge)
    readme = examples(ROOT / "README.md")
    assert readme[0].text == "pip install ." and readme[2].text.startswith("pip install")
    shown = next(e for e in readme if e.text == "traceforge generate -o traces")
    assert shown.output and shown.output[0].startswith("wrote 8 ranks")


# -- inline flags and module paths ----------------------------------------------------------

SPAN = re.compile(r"`([^`\n]+)`")


def inline_spans(doc: Path) -> list[tuple[int, str]]:
    """Inline code spans outside fenced blocks, with their line numbers."""
    spans, fenced = [], False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            spans += [(number, m.group(1)) for m in SPAN.finditer(line)]
    return spans


def option_names(command: Any) -> set[str]:
    return {name for p in command.params for name in (*p.opts, *p.secondary_opts)}


# Flags of other programs the prose names (ASTRA-sim's options); a document about another
# program's arguments (Megatron-LM's, in megatron-parity.md) has its bare flags unchecked.
FOREIGN_FLAGS = {"--logging-folder", "--num-queues-per-dim",
                 "--trace-path", "--backend", "--device"}  # the last three: PARAM's comm replay (docs/replay.md)
FOREIGN_FLAG_DOCS = {"megatron-parity.md"}


def script_flags(script: str) -> set[str]:
    """The flags a benchmark or script takes: the string literals in its source (`"--quick"`,
    argparse's `add_argument("--dp")`). Never run to ask: some have no --help and would run."""
    return set(re.findall(r"[\"'](--[\w-]+)", (ROOT / script).read_text(encoding="utf-8")))


def flags_in(words: list[str]) -> list[str]:
    """`--a`, `--a=1`, `[--a]`, `--a/--b`; `--scale-up-bw/-latency` and
    `--decoder-first/last-pipeline-num-layers` stay one compound (see compound_known)."""
    found = []
    for word in words:
        word = word.strip("[]").split("=")[0].rstrip(",.;:)]")
        parts = word.split("/")
        if all(p.startswith("--") for p in parts):
            found += parts
        elif parts[0].startswith("--"):
            found.append(word)
    return found


def known_flag(flag: str, known: set[str]) -> bool:
    """A flag, or a compound `--x-a/b-y/-z` naming several (one starts with `--x-a`, each other
    one starts with `--x` and ends with its part)."""
    head, *tails = flag.split("/")
    stem = "--" + head.split("-")[2]
    if not tails:
        return head in known
    return any(k.startswith(head) for k in known) and all(
        any(k.endswith(tail.lstrip("-")) and k.startswith(stem) for k in known) for tail in tails)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_inline_flags_exist(doc):
    """`traceforge CMD ... --flag` in prose: CMD exists and has --flag (values may be placeholders
    such as `zipf:S|trace:FILE`); `python benchmarks/X.py --flag`: X.py lists it in --help; a
    bare `--flag` is some command's, benchmark's or script's, or in FOREIGN_FLAGS (`--scale-up-*`
    any)."""
    problems = []
    scripts_dirs = [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.py")]
    everything = ({f for c in CLI.commands.values() for f in option_names(c)} | FOREIGN_FLAGS | {"--help"}
                  | {f for p in scripts_dirs for f in script_flags(str(p.relative_to(ROOT)))})
    scripts: dict[str, set[str]] = {}
    for number, span in inline_spans(doc):
        words = span.split()
        where = f"{doc.relative_to(ROOT)}:{number}: `{span}`"
        script = next((w for w in words if re.match(r"^(benchmarks|scripts)/\w+\.py$", w)), None)
        if len(words) >= 2 and words[0] == "traceforge" and not words[1].startswith("-") and not words[1].isupper():
            command = CLI.get_command(typer.Context(CLI), words[1])
            if command is None:
                problems.append(f"{where}: no command {words[1]!r}")
                continue
            known = option_names(command) | {"--help"}
            problems += [f"{where}: `traceforge {words[1]}` has no {f}" for f in flags_in(words[2:]) if not known_flag(f, known)]
        elif script:
            if script not in scripts:
                scripts[script] = script_flags(script) if (ROOT / script).is_file() else set()
            problems += [f"{where}: {script} has no {f}" for f in flags_in(words) if not known_flag(f, scripts[script])]
        elif doc.name not in FOREIGN_FLAG_DOCS:
            for flag in flags_in(words):
                if flag.endswith("*") and any(f.startswith(flag[:-1]) for f in everything):
                    continue
                if not known_flag(flag, everything) and not any(known_flag(flag, f) for f in scripts.values()):
                    problems.append(f"{where}: no command, benchmark or FOREIGN_FLAGS entry has {flag}")
    assert not problems, "\n".join(problems)


PACKAGE = ROOT / "traceforge"
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
TOP_DIRS = ("traceforge", "tests", "benchmarks", "scripts", "docs", "samples", "proto")
ROOTS = "|".join((*TOP_DIRS, *SUBPACKAGES))
# A path inside the repo that names a file or a folder: traceforge/x.py, program/, write/astra*.py,
# write/writer.estimate_bytes (a module and a name in it). `check/report` (prose) names neither.
REPO_PATH = re.compile(rf"(?<![\w./-])((?:{ROOTS})/(?:[\w*-]+/)*(?:[\w*-]+\.\w+(?:\.\w+)?)?)(?![\w/-])")
BARE_MODULE = re.compile(r"^[`*|(\[]*(\w+\.py)[`*|)\],.;:]*$")
FOLDER = re.compile(r"^[`*|(\[]*(?:traceforge/)?(%s)/[`*|)\],.;:]*$" % "|".join(SUBPACKAGES))  # noqa: UP031
ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s")


def resolve(path: str) -> bool:
    """The path exists (a glob matches; `module.name` names a module that exists)."""
    if path.split("/")[0] in SUBPACKAGES:
        path = "traceforge/" + path
    if "*" in path:
        return any(ROOT.glob(path))
    head, _, tail = path.rpartition(".")
    return (ROOT / path).exists() or (ROOT / (head + ".py")).is_file() and tail.isidentifier()


def paragraphs(doc: Path) -> list[tuple[int, list[str]]]:
    """Paragraphs and list items (a table is one paragraph: its folder rows cover the rows below)."""
    found: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = 1
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or ITEM.match(line):
            if current:
                found.append((start, current))
            current = [line] if line.strip() else []
            start = number
        else:
            if not current:
                start = number
            current.append(line)
    if current:
        found.append((start, current))
    return found


@pytest.mark.parametrize("doc", [*DOCS, ROOT / "tests" / "program" / "test_fidelity.py"], ids=lambda d: str(d.relative_to(ROOT)))
def test_module_paths_the_docs_name_exist(doc):
    """`traceforge/read/scan.py`, `plan/`, and `schedules.py` in a list item about `plan/`."""
    problems = []
    name = doc.relative_to(ROOT)
    for start, lines in paragraphs(doc):
        folder = None
        for number, line in enumerate(lines, start):
            for match in REPO_PATH.finditer(line):
                if not resolve(match.group(1)):
                    problems.append(f"{name}:{number}: {match.group(1)} does not exist")
            for token in line.split():
                if FOLDER.match(token):
                    folder = FOLDER.match(token).group(1)
                bare = BARE_MODULE.match(token)
                if bare and folder and not (PACKAGE / folder / bare.group(1)).exists():
                    problems.append(f"{name}:{number}: {folder}/{bare.group(1)} does not exist")
    assert not problems, "\n".join(problems)


# A tracker reference, in any case: the word issue (or issues) followed by a number, with or without
# a "#", "no." or "number", or joined to it ("issue-N", a test named test_issue_N, a URL's
# issues/N); a ticket or GitHub's gh-N; a bare "#" and a number; or a ticket named without its
# number (its possessive, or "as the issue" asks, fixes, says or wants). Words like "issue order"
# are not references; a pull request of another project cited as a source (Megatron-LM's PR and
# its number) is not ours.
TRACKER_REFERENCE = re.compile(r"(?<![a-z])issues?(?:\s*(?:#|no\.?|number)|[-_/])?\s*\d+|\b(?:ticket|gh)[\s#_-]*\d+"
                               r"|(?<![&\w/])(?<!PR )#\d+\b|\bthe issue(?:'s|\s+(?:asks|fixes|says|wants))\b", re.IGNORECASE)


def tracker_references(text: str) -> list[str]:
    return [m.group(0) for m in TRACKER_REFERENCE.finditer(text)]


def test_the_tracker_guard_catches_every_spelling():
    word, n = "issue", 22  # built here, so that this file holds no reference itself
    for text in (f"see {word} {n}", f"({word.title()} {n}, item 4)", f"{word.upper()} {n}", f"{word}s 19 and 20",
                 f"{word} #{n}", f"{word.title()} No. {n}", f"{word} number {n}", f"{word}-{n}", f"{word}{n}",
                 f"def test_{word}_{n}_holds", f"github.com/o/r/{word}s/{n}", f"TICKET {n}", f"gh-{n}",
                 f"fixes #{n}", f"(#{n})", f"the {word}'s target", f"as the {word} fixes them"):
        assert tracker_references(text), text
    for text in (f"in {word} order", f"rep.{word}[c][1]", f"{word}d 3 sends", f"tissue {n}", f"Megatron-LM PR #{n}",
                 f"&#{n}79;", "docs/design.md#architecture"):
        assert not tracker_references(text), text


def test_no_reference_to_issues_outside_the_repo():
    """Code, tests, docs, scripts and benchmarks say what they mean and point at docs in this
    repository, never at tracker numbers (CONTRIBUTING)."""
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "tests").rglob("*.md"), *PACKAGE.rglob("*.py"), *DOCS,
             *(ROOT / "docs").rglob("*.md"), *(ROOT / "scripts").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "examples").glob("*.yaml"), ROOT / ".ci" / "run", ROOT / "pyproject.toml", ROOT / "CHANGELOG.md"]
    assert ROOT / "tests" / "suites" / "test_docs_examples.py" in files and ROOT / "CONTRIBUTING.md" in files
    offenders = sorted({f"{p.relative_to(ROOT)}: {ref!r}" for p in files if "_proto" not in p.parts
                        for ref in tracker_references(p.read_text(encoding="utf-8"))})
    assert not offenders, offenders


def test_every_example_file_is_used_by_the_docs_and_builds():
    from traceforge.config import build_spec, load_config_file

    text = "\n".join(doc.read_text(encoding="utf-8") for doc in DOCS)
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert {f.stem for f in files} >= {"dense", "gqa", "moe", "cp", "custom-gpu"}
    for path in files:
        assert f"-c examples/{path.name}" in text, f"no doc runs examples/{path.name}"
        spec = build_spec(None, load_config_file(path))
        assert spec.world_size <= RUN_MAX_RANKS, path  # small enough for the docs test to run it
