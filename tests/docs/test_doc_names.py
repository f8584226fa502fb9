"""Every name a page shows in backticks exists: options and their defaults, record fields, summary keys,
file names and repository paths; no page cites a path outside the repository; a paragraph lives on
one page. A failure names the page, the line and the unknown name, so whoever changed the code or
the page can mend it at once. The records' field tables are generated (tests/docs_tables.py).
"""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.run.account import GraphsRecord, RunRecord
from cosyclone.run.row_record import RowRecord
from cosyclone.talker.diagnostics import SamplerRowDiagnostics
from tests import doc_pages

ROOT = doc_pages.ROOT
PAGES = doc_pages.pages()
TICK = re.compile(r"`([^`\n]+)`")
SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
FILE = re.compile(r"^[\w.-]+\.(?:jsonl|json|py|md|sh|txt|yaml|toml|pt|onnx|parquet|tar|sqlite|cch)$")
#: File names the pages use as examples of a user's own files (not the product's or the repository's).
EXAMPLE_FILES = {"manifest.jsonl", "m.jsonl", "me.wav", "hello.wav", "bonjour.wav", "x.flac"}
TOP_DIRS = ("cosyclone/", "tests/", "benchmarks/", "docs/", "manifests/", ".ci/")
MIN_SHARED_WORDS = 25  # a paragraph this long on two pages is a copy: one page holds it, the others link


def ticked(page: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every backticked span in the page's prose (code blocks and comments left out)."""
    for i, line in enumerate(doc_pages.prose(PAGES[page]).splitlines(), start=1):
        for m in TICK.finditer(line):
            yield i, m.group(1)


def _commands() -> dict[str, object]:
    return typer.main.get_command(app).commands  # type: ignore[attr-defined,no-any-return]


def _flags(command: object) -> dict[str, object]:
    return {opt: p for p in command.params if p.param_type_name == "option"  # type: ignore[attr-defined]
            for opt in p.opts + p.secondary_opts if opt.startswith("-")}


def _source_names() -> set[str]:
    """Every identifier and string constant of the repository's Python code (the names a page may cite)."""
    names: set[str] = set()
    for path in [*ROOT.glob("cosyclone/**/*.py"), *ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("tests/**/*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(re.findall(r"[\w.-]+", node.value) + re.findall(r"\w+", node.value))
            elif isinstance(node, ast.alias):
                names.update((node.asname or node.name).split("."))
    return names


SOURCE_NAMES = _source_names()
#: The repository's file stems and folder names (`test_say_api`, `gpu_check`: a page names them as paths).
REPO_STEMS = {p.stem for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts}
#: Spans that name another package's API or the reference vectors' cases, not cosyclone's.
FOREIGN_SPAN = re.compile(r"^(?:resemblyzer|ray|torch|datasets|webdataset|vectors)[.:]")


@pytest.fixture(scope="module")
def run_folder(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tiny run's folder, the source of truth for summary keys and file names."""
    tmp = tmp_path_factory.mktemp("names")
    manifest = tmp / "m.jsonl"
    prompt = ROOT / "manifests" / "prompts" / "speaker1.wav"
    manifest.write_text(json.dumps({"id": "a", "prompt_audio": str(prompt), "text": "Hello there.",
                                    "prompt_text": "This is the reference speaker talking."}) + "\n")
    res = CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(tiny_model_dir), "--out",
                                   str(tmp / "out"), "--max-tokens", "5", "--quiet"])
    assert res.exit_code == 0, res.output
    return tmp / "out"


def _keys(obj: object, prefix: str = "") -> Iterator[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + k
            yield from _keys(v, prefix + k + ".")


# ----------------------------------------------------------------------------- options


def _cli_rows(section: str) -> list[tuple[int, str, str]]:
    """(line, flag, default cell) of each row of the option table that follows ``section`` in docs/cli.md."""
    text = PAGES["docs/cli.md"]
    start = text.index(section)
    rows = []
    for i, line in enumerate(text[start:].splitlines()):
        if i and line.startswith("| `--"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.append((text[:start].count("\n") + i + 1, cells[0].strip("`").split()[0], cells[1]))
        elif rows and not line.startswith("|"):
            break
    return rows


def _default_words(value: object) -> str | None:
    """How docs/cli.md writes a default (None: the default is described in words, not checked)."""
    if value is None or value == () or value == []:
        return None
    if value is False:
        return "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@pytest.mark.parametrize(("command", "section"), [("synth", "`synth MANIFEST`:"), ("export", "`export OUT` writes")])
def test_the_option_tables_are_the_commands_options(command: str, section: str) -> None:
    flags = _flags(_commands()[command])
    problems = []
    for line, flag, default in _cli_rows(section):
        if flag not in flags:
            problems.append(f"docs/cli.md:{line}: `{flag}` is not an option of `cosyclone {command}`")
            continue
        words = _default_words(flags[flag].default)  # type: ignore[attr-defined]
        if words is not None and words not in default.replace("`", "").split():
            problems.append(f"docs/cli.md:{line}: `{flag}` defaults to {words!r}; the table says {default!r}")
    documented = {flag for _, flag, _ in _cli_rows(section)}
    missing = sorted(f for f in flags if f.startswith("--") and f not in documented and f != "--help"
                     and not flags[f].hidden)  # type: ignore[attr-defined]
    if command == "synth":  # the top-level option lives beside the table
        missing = [f for f in missing if f != "--version"]
    problems += [f"docs/cli.md: the `{command}` table lacks `{f}`" for f in missing]
    assert not problems, "\n".join(problems)


def test_every_flag_a_page_names_is_an_option() -> None:
    """A `--flag` in a page's prose is an option of some cosyclone command (or of the tool named beside it)."""
    known = {"--version", "--help"} | {n for n in SOURCE_NAMES if n.startswith("--")}  # benchmarks' flags too
    for cmd in _commands().values():
        known |= set(_flags(cmd))
    foreign = {"--no-deps", "--index-url", "--target", "--no-index", "--include", "--local-dir", "--local_dir",
               "--parts", "--python-version", "--hift-only", "--batches", "--hift-reps", "--quick", "--copy_files",
               "--quantization", "--output_dir", "--model", "--head", "--port", "--address", "--dashboard-host"}
    problems = []
    for page in PAGES:
        for line, span in ticked(page):
            for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", span):
                if flag not in known and flag not in foreign:
                    problems.append(f"{page}:{line}: `{flag}` is no option of any cosyclone command")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- records and keys


def test_every_dotted_record_path_exists(run_folder: Path) -> None:
    """`last_run.X`, `last_run.options.X`, `last_run.cuda_graphs.X` and `sampler[].X` name real fields."""
    summary = json.loads((run_folder / "summary.json").read_text())
    run_fields = {f.name for f in fields(RunRecord)}
    nested = {"cuda_graphs": {f.name for f in fields(GraphsRecord)},
              "options": set(summary["last_run"]["options"]), "output": set(summary["last_run"]["output"]),
              "versions": set(summary["last_run"]["versions"]) | {"cosyclone", "torch", "python"}}
    sampler = {f.name for f in fields(SamplerRowDiagnostics)}
    problems = []
    for page in PAGES:
        for line, span in ticked(page):
            for path in re.findall(r"(?<![\w.])(?:last_run|sampler\[\])\.[\w.]+", span):
                parts = path.split(".")
                if parts[0] == "last_run":
                    ok = parts[1] in run_fields and (len(parts) == 2 or parts[2] in nested.get(parts[1], ()))
                else:
                    ok = parts[1] in sampler
                if not ok:
                    problems.append(f"{page}:{line}: `{path}` names no field (RunRecord, its options, "
                                    "GraphsRecord or SamplerRowDiagnostics)")
    assert not problems, "\n".join(problems)


def test_the_totals_paragraph_names_summary_keys(run_folder: Path) -> None:
    """docs/output.md's Totals: every key it names is in a real run's summary.json (its sampler dict too)."""
    summary = json.loads((run_folder / "summary.json").read_text())
    keys = set(summary) | set(summary["sampler"])
    text = PAGES["docs/output.md"]
    start = text.index("**Totals**")
    end = text.index("\n\n", start)
    line0 = text[:start].count("\n") + 1
    problems = []
    for i, line in enumerate(text[start:end].splitlines()):
        for m in TICK.finditer(line):
            name = m.group(1)
            if SNAKE.match(name) or name in ("rows", "done", "failed", "sampler"):
                if name not in keys:
                    problems.append(f"docs/output.md:{line0 + i}: `{name}` is no key of summary.json")
    assert not problems, "\n".join(problems)


def test_every_snake_case_name_exists(run_folder: Path) -> None:
    """A backticked `some_name` is a record field, a summary key, an option or a name in the code.

    Catches the field renamed in code but not on the page (and the page's typo)."""
    known = set(SOURCE_NAMES) | REPO_STEMS
    for cls in (RowRecord, RunRecord, GraphsRecord, SamplerRowDiagnostics):
        known |= {f.name for f in fields(cls)}
    for path in run_folder.rglob("*.json*"):
        for raw in path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]:
            if raw.strip():
                known |= {k.rsplit(".", 1)[-1] for k in _keys(json.loads(raw))}
    problems = []
    for page in PAGES:
        for line, span in ticked(page):
            if FOREIGN_SPAN.match(span):
                continue
            for word in re.findall(r"[A-Za-z_][\w]*", span):
                if SNAKE.match(word) and word not in known:
                    problems.append(f"{page}:{line}: `{word}` (in `{span}`) is no field, key, option or name "
                                    "in the code")
    assert not problems, "\n".join(sorted(set(problems)))


# ----------------------------------------------------------------------------- files and paths


def test_every_file_and_path_a_page_names_exists(run_folder: Path) -> None:
    """A repository path names a file or folder of the checkout; a bare file name is one the code writes
    or reads, one of the repository's, or a user's example (EXAMPLE_FILES)."""
    basenames = {p.name for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts}
    written = {p.name for p in run_folder.rglob("*")}
    problems = []
    for page in PAGES:
        for line, span in ticked(page):
            for token in span.split():
                token = token.strip("(),;:'\"")
                if token.startswith(TOP_DIRS) and not re.search(r"[<>*{}]|NNNNN|\.\.\.", token):
                    target = token.split("::")[0].rstrip("/")
                    if not (ROOT / target).exists():
                        problems.append(f"{page}:{line}: `{token}` does not exist in the repository")
                elif FILE.match(token) and token not in EXAMPLE_FILES | basenames | written | SOURCE_NAMES:
                    problems.append(f"{page}:{line}: `{token}` is a file name nothing in the code writes or reads")
    assert not problems, "\n".join(problems)


def test_no_page_cites_a_path_outside_the_repository() -> None:
    """A clone holds only the repository: no `../` out of it, no `shared/...` reference material."""
    problems = []
    for page, text in PAGES.items():
        base = (ROOT / page).parent
        for i, line in enumerate(text.splitlines(), start=1):
            for m in re.finditer(r"(?<![\w/.-])((?:\.\./)+[\w.-][\w./-]*)", line):
                if not (base / m.group(1)).resolve().is_relative_to(ROOT):
                    problems.append(f"{page}:{i}: {m.group(1)} lies outside the repository")
            for m in re.finditer(r"(?<![\w-])shared/[\w./-]+", line):
                problems.append(f"{page}:{i}: {m.group(0)} is not in a clone of the repository")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- one paragraph, one page


def _paragraphs(text: str) -> Iterator[tuple[int, str]]:
    line = 1
    for chunk in re.split(r"\n[ \t]*\n", doc_pages.prose(text)):
        words = " ".join(chunk.split())
        if len(words.split()) >= MIN_SHARED_WORDS and not words.startswith(("|", "#")):
            yield line + len(chunk) - len(chunk.lstrip("\n")), words
        line += chunk.count("\n") + 2


def test_a_paragraph_lives_on_one_page() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for page, text in PAGES.items():
        for line, words in _paragraphs(text):
            seen[words].append(f"{page}:{line}")
    copies = [f"{' and '.join(where)}: {words[:90]}..." for words, where in seen.items() if len(where) > 1]
    assert not copies, "the same paragraph on two pages (keep it on one, link from the other):\n" + "\n".join(copies)
