"""Every name a page shows in backticks exists: options and their defaults, record fields, summary keys,
file names and repository paths; no page cites a path outside the repository; a paragraph lives on
one page. A failure names the page, the line and the unknown name, so whoever changed the code or
the page can mend it at once. The records' field tables are generated (tests/docs_tables.py).
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder.row_record import RowRecord
from cosyclone.run.account import GraphsRecord, RunRecord
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


def ticked(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every backticked span in a page's prose (code blocks and comments left out)."""
    for i, line in enumerate(doc_pages.prose(text).splitlines(), start=1):
        for m in TICK.finditer(line):
            yield i, m.group(1)


def _commands() -> dict[str, object]:
    commands: dict[str, object] = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    return commands


def _flags(command: object) -> dict[str, object]:
    return {opt: p for p in command.params if p.param_type_name == "option"  # type: ignore[attr-defined]
            for opt in p.opts + p.secondary_opts if opt.startswith("-")}


def _source_names() -> set[str]:
    """Every identifier and string constant of the repository's Python code (the names a page may cite)."""
    names: set[str] = set()
    here = Path(__file__).parent  # these checks' own examples of wrong names are no names
    code = [*ROOT.glob("cosyclone/**/*.py"), *ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("tests/**/*.py")]
    for path in code:
        if path.parent == here:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.arg, ast.keyword)):
                names.add(node.arg or "")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(re.findall(r"[\w.-]+", node.value) + re.findall(r"\w+", node.value))
            elif isinstance(node, ast.alias):
                names.update((node.asname or node.name).split("."))
    return names


def _repo_paths() -> list[Path]:
    """The checkout's files and folders, without hidden folders (.git, .venv, .tiny-model) and caches."""
    out = []
    for here, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if (not d.startswith(".") or d == ".ci") and d != "__pycache__"]
        out += [Path(here) / name for name in dirs + files]
    return out


SOURCE_NAMES = _source_names()
REPO_PATHS = _repo_paths()
#: The repository's file stems and folder names (`test_say_api`, `gpu_check`: a page names them as paths).
REPO_STEMS = {p.stem for p in REPO_PATHS}
#: Spans that name another package's API or the reference vectors' cases, not cosyclone's.
FOREIGN_SPAN = re.compile(r"^(?:resemblyzer|ray|torch|datasets|webdataset|lhotse|vectors)[.:]")
FILE_SPAN = re.compile(r"^[\w.-]+\.[a-z0-9]+(?:\.gz)?$")


def _library_names() -> set[str]:
    """The public names of the libraries the pages show in use (a `datasets.Dataset`'s `push_to_hub`)."""
    import importlib

    names: set[str] = set()
    for module, classes in (("datasets", ("Dataset", "DatasetDict")), ("webdataset", ())):
        try:
            mod = importlib.import_module(module)
        except ImportError:  # not installed: its names are not checked against it
            continue
        names |= set(dir(mod))
        for cls in classes:
            names |= set(dir(getattr(mod, cls)))
    return names


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


@pytest.mark.parametrize(("command", "section"),
                         [("synth", "`synth MANIFEST`:"), ("export", "`export OUT")])
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


FOREIGN_FLAGS = {"--no-deps", "--index-url", "--target", "--no-index", "--include", "--local-dir",
                 "--local_dir",
                 "--copy_files", "--quantization", "--output_dir", "--model", "--head", "--port", "--address",
                 "--dashboard-host"}  # pip's, hf's, modelscope's, ct2's and ray's, named beside those tools


def flag_problems(pages: dict[str, str]) -> list[str]:
    known = {"--version", "--help"} | {n for n in SOURCE_NAMES if n.startswith("--")}  # benchmarks' flags too
    for cmd in _commands().values():
        known |= set(_flags(cmd))
    problems = []
    for page, text in pages.items():
        for line, span in ticked(text):
            for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", span):
                if flag not in known and flag not in FOREIGN_FLAGS:
                    problems.append(f"{page}:{line}: `{flag}` is no option of any cosyclone command")
    return problems


def test_every_flag_a_page_names_is_an_option() -> None:
    """A `--flag` in a page's prose is an option of a cosyclone command, a benchmark's, or another tool's."""
    problems = flag_problems(PAGES)
    assert not problems, "\n".join(problems)


def test_the_say_paragraph_lists_say_s_options() -> None:
    """docs/cli.md lists `say`'s options in a paragraph: each it names is `say`'s, and each of `say`'s
    is named."""
    text = PAGES["docs/cli.md"]
    start = text.index("`say TEXT --prompt-audio FILE` takes")
    para = text[start:text.index("`validate MANIFEST`", start)]
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", para))
    flags = {f for f, p in _flags(_commands()["say"]).items()
             if f.startswith("--") and f != "--help" and not p.hidden}  # type: ignore[attr-defined]
    assert named <= flags, f"docs/cli.md: not options of `say`: {sorted(named - flags)}"
    assert flags <= named, f"docs/cli.md: `say`'s paragraph lacks {sorted(flags - named)}"


def test_the_benchmarks_page_lists_what_make_bench_runs() -> None:
    from benchmarks.run_all import STAGE_BENCHMARKS

    text = PAGES["docs/benchmarks.md"]
    listed = text[text.index("`make bench` (`python -m benchmarks.run_all`) runs"):].split(")", 2)[1]
    named = re.findall(r"`(bench_\w+)`", listed)
    assert named == list(STAGE_BENCHMARKS), (
        f"docs/benchmarks.md lists {named}; make bench runs {STAGE_BENCHMARKS}")


# ----------------------------------------------------------------------------- records and keys


def dotted_problems(pages: dict[str, str], summary: dict[str, Any]) -> list[str]:
    run_fields = {f.name for f in fields(RunRecord)}
    nested = {"cuda_graphs": {f.name for f in fields(GraphsRecord)},
              "options": set(summary["last_run"]["options"]), "output": set(summary["last_run"]["output"]),
              "versions": set(summary["last_run"]["versions"]) | {"cosyclone", "torch", "python"}}
    sampler = {f.name for f in fields(SamplerRowDiagnostics)}
    problems = []
    for page, text in pages.items():
        for line, span in ticked(text):
            for path in re.findall(r"(?<![\w.])(?:last_run|sampler\[\])\.[\w.]+", span):
                parts = path.split(".")
                if parts[0] == "last_run":
                    ok = parts[1] in run_fields and (len(parts) == 2 or parts[2] in nested.get(parts[1], ()))
                else:
                    ok = parts[1] in sampler
                if not ok:
                    problems.append(f"{page}:{line}: `{path}` names no field (RunRecord, its options, "
                                    "GraphsRecord or SamplerRowDiagnostics)")
    return problems


def test_every_dotted_record_path_exists(run_folder: Path) -> None:
    """`last_run.X`, `last_run.options.X`, `last_run.cuda_graphs.X` and `sampler[].X` name real fields."""
    problems = dotted_problems(PAGES, json.loads((run_folder / "summary.json").read_text()))
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
            if (SNAKE.match(name) or name in ("rows", "done", "failed", "sampler")) and name not in keys:
                problems.append(f"docs/output.md:{line0 + i}: `{name}` is no key of summary.json")
    assert not problems, "\n".join(problems)


def known_names(run_folder: Path) -> set[str]:
    known = set(SOURCE_NAMES) | REPO_STEMS | _library_names()
    for cls in (RowRecord, RunRecord, GraphsRecord, SamplerRowDiagnostics):
        known |= {f.name for f in fields(cls)}
    for path in run_folder.rglob("*.json*"):
        for raw in path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]:
            if raw.strip():
                known |= {k.rsplit(".", 1)[-1] for k in _keys(json.loads(raw))}
    return known


def snake_problems(pages: dict[str, str], known: set[str]) -> list[str]:
    problems = []
    for page, text in pages.items():
        for line, span in ticked(text):
            if FOREIGN_SPAN.match(span) or FILE_SPAN.match(span):  # files: file_problems checks them
                continue
            for word in re.findall(r"[A-Za-z_][\w]*", span):
                if SNAKE.match(word) and word not in known:
                    problems.append(f"{page}:{line}: `{word}` (in `{span}`) is no field, key, option or name "
                                    "in the code")
    return sorted(set(problems))


def test_every_snake_case_name_exists(run_folder: Path) -> None:
    """A backticked `some_name` is a record field, a summary key, an option or a name in the code.

    Catches the field renamed in code but not on the page (and the page's typo)."""
    problems = snake_problems(PAGES, known_names(run_folder))
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- files and paths


def file_problems(pages: dict[str, str], written: set[str]) -> list[str]:
    basenames = {p.name for p in REPO_PATHS}
    problems = []
    for page, text in pages.items():
        for line, span in ticked(text):
            for token in span.split():
                token = token.strip("(),;:'\"")
                if re.search(r"[<>*{}]|NNNNN|\d{5}|\.\.\.", token):  # a pattern of names, not a name
                    continue
                if token.startswith(TOP_DIRS):
                    target = token.split("::")[0].rstrip("/")
                    if not (ROOT / target).exists():
                        problems.append(f"{page}:{line}: `{token}` does not exist in the repository")
                elif (FILE.match(token) and token not in EXAMPLE_FILES | basenames | written | SOURCE_NAMES
                      and not (token.count(".") > 1  # a name made as `{stem}.redo.jsonl`
                               and "." + token.split(".", 1)[1] in SOURCE_NAMES)):
                    problems.append(f"{page}:{line}: `{token}` is a file name nothing in the code writes "
                                    "or reads")
    return problems


def test_every_file_and_path_a_page_names_exists(run_folder: Path) -> None:
    """A repository path names a file or folder of the checkout; a bare file name is one the code writes
    or reads, one of the repository's, or a user's example (EXAMPLE_FILES)."""
    problems = file_problems(PAGES, {p.name for p in run_folder.rglob("*")})
    assert not problems, "\n".join(problems)


def outside_problems(pages: dict[str, str]) -> list[str]:
    problems = []
    for page, text in pages.items():
        base = (ROOT / page).parent
        for i, line in enumerate(text.splitlines(), start=1):
            for m in re.finditer(r"(?<![\w/.-])((?:\.\./)+[\w.-][\w./-]*)", line):
                if not (base / m.group(1)).resolve().is_relative_to(ROOT):
                    problems.append(f"{page}:{i}: {m.group(1).rstrip('.')} lies outside the repository")
            for m in re.finditer(r"(?<![\w-])shared/[\w./-]+", line):
                problems.append(f"{page}:{i}: {m.group(0).rstrip('.')} is not in a clone of the repository")
    return problems


def test_no_page_cites_a_path_outside_the_repository() -> None:
    """A clone holds only the repository: no `../` out of it, no `shared/...` reference material."""
    problems = outside_problems(PAGES)
    assert not problems, "\n".join(problems)


def test_no_page_or_message_installs_cosyclone_from_pypi() -> None:
    """cosyclone is installed from its checkout (`pip install -e '.[ray]'`): there is no PyPI package."""
    texts = {**PAGES, **{str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
                         for p in ROOT.glob("cosyclone/**/*.py")}}
    found = [f"{name}:{i}: {line.strip()}" for name, text in texts.items()
             for i, line in enumerate(text.splitlines(), start=1) if re.search(r"cosyclone\\?\[", line)]
    assert not found, "say pip install -e '.[EXTRA]' (from the checkout):\n" + "\n".join(found)


# ----------------------------------------------------------------------------- one paragraph, one page


def _paragraphs(text: str) -> Iterator[tuple[int, str]]:
    line = 1
    for chunk in re.split(r"\n[ \t]*\n", doc_pages.prose(text)):
        words = " ".join(chunk.split())
        if len(words.split()) >= MIN_SHARED_WORDS and not words.startswith(("|", "#")):
            yield line + len(chunk) - len(chunk.lstrip("\n")), words
        line += chunk.count("\n") + 2


def copied_paragraphs(pages: dict[str, str]) -> list[str]:
    seen: dict[str, list[str]] = defaultdict(list)
    for page, text in pages.items():
        for line, words in _paragraphs(text):
            seen[words].append(f"{page}:{line}")
    return [f"{' and '.join(where)}: {words[:90]}..." for words, where in seen.items() if len(where) > 1]


def test_a_paragraph_lives_on_one_page() -> None:
    copies = copied_paragraphs(PAGES)
    assert not copies, ("the same paragraph twice (keep it on one page, link from the others):\n"
                        + "\n".join(copies))


def test_each_checker_names_the_page_the_line_and_the_name(tmp_path: Path) -> None:
    """The checkers fail on a wrong page, naming what is wrong where (else a passing suite proves nothing)."""
    para = " ".join(["word"] * MIN_SHARED_WORDS)
    bad = {"docs/bad.md": "# Bad\n\n"
                          "Use `--no-such-flag` and `last_run.no_such_field`, see `sampler[].steps`.\n"
                          "The `talker_checkpoint_hitz` count, `tests/no_such_test.py`, `out.jsonl`.\n"
                          f"Vectors: ../../elsewhere/x and shared/reference/x.\n\n{para}\n",
           "docs/other.md": f"{para}\n"}
    summary = {"last_run": {"options": {"top_k": 25}, "output": {}, "versions": {}}}
    assert flag_problems(bad) == ["docs/bad.md:3: `--no-such-flag` is no option of any cosyclone command"]
    dotted = [p.split(" names")[0] for p in dotted_problems(bad, summary)]
    assert dotted == ["docs/bad.md:3: `last_run.no_such_field`"]
    snake = snake_problems(bad, SOURCE_NAMES)
    assert any(p.startswith("docs/bad.md:4: `talker_checkpoint_hitz`") for p in snake), snake
    assert file_problems(bad, set()) == [
        "docs/bad.md:4: `tests/no_such_test.py` does not exist in the repository",
        "docs/bad.md:4: `out.jsonl` is a file name nothing in the code writes or reads"]
    assert outside_problems(bad) == ["docs/bad.md:5: ../../elsewhere/x lies outside the repository",
                                     "docs/bad.md:5: shared/reference/x is not in a clone of the repository"]
    copies = copied_paragraphs(bad)
    assert copies and copies[0].startswith("docs/bad.md:7 and docs/other.md:1"), copies
