"""The GPU check's pieces that run anywhere, without network or GPU: the wheel bundle's checker
(benchmarks/gpu_bundle.py) on hand-made wheels, the real pins against pyproject.toml and the image's
list, the structure and time budget of benchmarks/gpu_check.sh, a short dry run of two of its parts
that prints the one summary table, and that it cannot pass without evidence: a real run on a CPU
fails within seconds, gpu tests that all skipped fail, an e2e part without graph steps fails (a
stand-in interpreter written here), and a hanging part is interrupted or killed. ``make
gpu-rehearsal`` runs the whole dry run in a fresh venv."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from benchmarks import gpu_bundle as gb
from cosyclone.cli import app

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _wheel(folder: Path, name: str, version: str, requires: list[str] = (), tag: str = "py3-none-any",  # type: ignore[assignment]
           pad: int = 0) -> gb.Wheel:
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    meta = "\n".join([f"Name: {name}", f"Version: {version}", *[f"Requires-Dist: {r}" for r in requires]])
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(
            f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "Metadata-Version: 2.1\n" + meta + "\n"
        )
        if pad:
            z.writestr("pad.bin", os.urandom(pad))
    return gb.read_wheel(path)


def test_checker_accepts_a_complete_bundle_and_names_each_problem(tmp_path: Path) -> None:
    image = {"numpy": "2.5.2", "typing-extensions": None}
    pins: dict[str, str | None] = {"soundfile": "0.14.0", "cffi": "2.1.1", "pycparser": "3.12"}
    good = [
        _wheel(
            tmp_path,
            "soundfile",
            "0.14.0",
            ["cffi>=1.0", "numpy", "typing-extensions"],
            tag="py2.py3-none-manylinux_2_28_x86_64",
        ),
        _wheel(
            tmp_path,
            "cffi",
            "2.1.1",
            ['pycparser; implementation_name != "PyPy"'],
            tag="cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64",
        ),
        _wheel(tmp_path, "pycparser", "3.12", ['pytest; extra == "test"', 'tomli; python_version < "3.11"']),
    ]
    roots = ["soundfile>=0.12", "numpy>=1.24"]
    assert gb.check(good, pins, image, "3.12", roots) == []
    # the same wheels for another Python: a cp312 build does not install on 3.11
    assert gb.check(good, pins, image, "3.11", roots) == [
        "cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl does not install on "
        "CPython 3.11 x86-64 Linux"
    ]
    # a requirement nobody meets, one the image's known version does not meet, a wheel too many
    other = tmp_path / "other"
    other.mkdir()
    bad = [*good, _wheel(other, "numpy", "2.4.0"), _wheel(other, "cffi", "2.0.0")]
    problems = gb.check(bad, pins, image, "3.12", [*roots, "wetext==0.1.8", "numpy>=3"])
    assert any(p.startswith("two wheels for cffi:") for p in problems), problems
    assert "numpy is on the image already: bundling it would shadow the image's" in problems
    assert any(p.startswith("numpy-2.4.0-py3-none-any.whl is not pinned") for p in problems)
    assert any(
        p.startswith("cosyclone needs wetext==0.1.8: neither bundled nor on the image") for p in problems
    )
    assert any(p.startswith("cosyclone needs numpy>=3") for p in problems), problems
    # a pin without its wheel, a wheel of another version than its pin
    assert gb.check(good[:2], pins, image, "3.12", roots) == [
        "no wheel for the pin pycparser==3.12",
        'cffi needs pycparser; implementation_name != "PyPy": '
        "neither bundled nor on the image (add it to "
        "gpu_bundle_pins.txt)",
    ]
    assert gb.check(good, {**pins, "cffi": "2.0"}, image, "3.12", roots) == [
        "cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl is 2.1.1, pinned 2.0"]


def test_checker_refuses_a_bundle_over_its_limit(tmp_path: Path) -> None:
    w = _wheel(tmp_path, "big", "1.0", pad=300_000)
    assert gb.check([w], {"big": "1.0"}, {}, "3.12", [], limit_mb=0.25) == [
        f"the bundle is {w.path.stat().st_size / 2**20:.1f} MB, over the 0.25 MB limit"]
    assert gb.check([w], {"big": "1.0"}, {}, "3.12", [], limit_mb=1) == []


def test_a_bundled_wheels_unused_requirements_are_passed_over_and_only_theirs(tmp_path: Path) -> None:
    """s3tokenizer lists pre-commit and torchaudio, speakerlab-slim modelscope: nothing the check runs
    imports them (gpu_bundle.UNUSED), so they need not be bundled; cosyclone's own needs still must be."""
    wheels = [_wheel(tmp_path, "s3tokenizer", "0.3.0", ["pre-commit", "torchaudio", "einops"]),
              _wheel(tmp_path, "speakerlab-slim", "0.1.0", ["modelscope>=1.33.0", "scipy>=1.7"])]
    pins: dict[str, str | None] = {"s3tokenizer": "0.3.0", "speakerlab-slim": "0.1.0"}
    image: dict[str, str | None] = {"einops": None, "scipy": "1.16.0"}
    assert gb.check(wheels, pins, image, "3.12", []) == []
    assert gb.check(wheels, pins, image, "3.12", ["modelscope"]) == [
        "cosyclone needs modelscope: neither bundled nor on the image (add it to gpu_bundle_pins.txt)"]
    assert gb.check(wheels, pins, {"einops": None}, "3.12", []) == [
        "speakerlab-slim needs scipy>=1.7: neither bundled nor on the image (add it to gpu_bundle_pins.txt)"]


def test_real_pins_follow_the_project_and_leave_the_image_alone() -> None:
    """The bundle's pins are the project's own (pyproject pins wetext and inflect), none of them is on
    the image (it would shadow it), and every cosyclone requirement is pinned or on the image."""
    pins, image = gb.read_list(gb.PINS), gb.read_list(gb.IMAGE)
    assert not set(pins) & set(image)
    assert all(v for v in pins.values())  # exact versions only
    for req in gb.needed(gb.project_requirements(), "3.12"):
        name = gb.canonical(req.name)
        assert name in pins or name in image, req
        if req.specifier and "==" in str(req.specifier):
            assert f"=={pins[name]}" == str(req.specifier), (req, pins[name])
    assert {"soundfile", "wetext", "inflect", "torch", "transformers", "onnxruntime"} <= set(pins) | set(
        image
    )
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0"


def _script() -> str:
    return SCRIPT.read_text()


def test_script_uses_the_machines_python_and_installs_only_the_bundle() -> None:
    text = _script()
    code = "\n".join(
        line for line in text.replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#")
    )
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    # no isolated venv, the image's torch stays visible
    assert "make install" not in code and "venv" not in code
    installs = [line for line in code.splitlines() if "pip install" in line]
    assert len(installs) == 1 and "--no-index" in installs[0] and "--no-deps" in installs[0], installs
    assert "--target" in installs[0] and "torch" not in installs[0]
    assert 'PY=${PY:-python3}' in code


def _constants(code: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^(BUDGET|PROBE|INSTALL|KILL|GRACE)=(\d+)", code, re.M)}


def _gpu_limits(code: str) -> list[int]:
    found = re.search(r'MODE="GPU"\n(?:.*\n)*?\s*LIMITS=\(([\d ]+)\)', code)
    assert found, "no LIMITS=(...) in the GPU branch"
    return [int(x) for x in found.group(1).split()]


def test_script_runs_five_parts_in_order_each_under_an_interrupting_timeout() -> None:
    code = _script()
    parts = re.findall(r"run_part (\d) (\w+) \"\$\{LIMITS\[(\d)\]\}\"", code)
    assert parts == [("1", "env", "0"), ("2", "decode", "1"), ("3", "e2e", "2"), ("4", "gpu_tests", "3"),
                     ("5", "parity", "4")]
    # SIGINT first (a Python traceback), KILL after KILL s, given up GRACE s later (stuck in the driver)
    assert (
        'timeout --signal=KILL $((limit + KILL + GRACE)) \\\n'
        '    timeout --signal=INT --kill-after=$KILL "$limit" "$@"'
        in code
    )
    # files back from $OUT: one log per part, figures.jsonl, summary.txt (the device returns 8 at most)
    assert len(parts) + 2 <= 8 and "figures.jsonl" in code and "summary.txt" in code
    # on a GPU every part runs on the GPU (no CPU fallback), part 1 requires CUDA
    gpu = code[code.index('MODE="GPU"'):code.index("AUTO_PARITY=0")]
    assert "ENV_FLAG=--require-cuda" in gpu and "--device cpu" not in gpu
    assert "STEP_ARGS=(--device cuda" in gpu and "E2E_ARGS=(--device cuda" in gpu
    assert "--require-graphs" in gpu  # e2e fails without a replayed graph
    # what users run: the default precision and the sized batch, so no dtype or batch is given there
    args = "\n".join(x for x in gpu.splitlines() if re.match(r"\s*(STEP|E2E)_ARGS=", x))
    assert not re.search(r"bf16|--dtype|--batch", args), args
    joined = code.replace("\\\n", " ")
    assert re.search(
        r"^export .*HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUBLAS_WORKSPACE_CONFIG=:4096:8", joined, re.M
    )


def test_worst_case_of_parts_1_to_4_fits_seven_minutes() -> None:
    """Parts 1-4 at worst (each interrupted, killed, then given up; the version probe and the install
    timed out) fit 420 s, so a rerun fits a 15-minute lease beside the machine's start; the script's
    header and docs/gpu.md state the same arithmetic. Parity runs by default only within the budget.
    part 1 keeps room for its own bounded commands (at least 45 s), the gpu tests at least 120 s."""
    code = _script()
    c, limits = _constants(code), _gpu_limits(code)
    worst = c["PROBE"] + c["INSTALL"] + c["KILL"] + sum(limits[:4]) + 4 * (c["KILL"] + c["GRACE"])
    assert worst <= c["BUDGET"] <= 420, (worst, c)
    assert limits[0] >= 45 and limits[3] >= 120, limits
    assert (
        'PYTAG=$(timeout -k 1 $((PROBE - 1)) "$PY"' in code
        and 'timeout -k $KILL $INSTALL "$PY" -m pip install' in code
    )
    verdict = re.search(r'timeout -k (\d+) (\d+) "\$PY" -m benchmarks.gpu_verdict', code)
    # inside the margin
    assert verdict and int(verdict.group(1)) + int(verdict.group(2)) <= c["KILL"] + c["GRACE"]
    stated = (
        f"PROBE {c['PROBE']} + INSTALL {c['INSTALL']} + KILL {c['KILL']} + "
        f"({' + '.join(map(str, limits[:4]))}) + 4 x (KILL {c['KILL']} + GRACE {c['GRACE']}) = {worst} s "
        f"<= BUDGET {c['BUDGET']} s"
    )
    assert stated in code
    assert [int(x) for x in re.findall(r"\[(\d+) s\]$", code[:code.index("set -uo")], re.M)] == limits
    docs = (ROOT / "docs" / "gpu.md").read_text()
    assert f"= {worst} s" in docs and f"{c['BUDGET']} s" in docs
    assert "$((SECONDS + LIMITS[4] + KILL + GRACE)) -gt \"$BUDGET\"" in code  # auto parity only within it


def test_script_picks_exactly_the_files_holding_gpu_tests() -> None:
    """Part 4 runs only the files with gpu-marked tests (``-m gpu`` over every module would import
    modules that need packages the check does not use)."""
    line = next(x for x in _script().splitlines() if x.startswith("mapfile -t GPU_FILES"))
    cmd = line.split("< <(", 1)[1].rsplit(")", 1)[0]
    found = subprocess.run(
        ["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    want = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if re.search(r"pytest\.mark\.gpu\b", p.read_text()))
    assert found == want and "tests/talker/test_cuda_graphs.py" in found


#: The check's CPU-side failures can only be shown where torch sees no GPU (on one, it really runs).
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")


def _check(tmp_path: Path, *args: str, py: str = sys.executable, script: Path = SCRIPT,
           **extra: str) -> tuple[int, str, float]:
    """Run the check (exit status, output, seconds) with its logs and work folder under tmp_path."""
    env = {**os.environ, "PY": py, "TMPDIR": str(tmp_path), "GPU_CHECK_LOGS": str(tmp_path / "logs"),
           "BUNDLE": str(tmp_path / "no-bundle"), **extra}
    env.pop("OUT", None)
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(script), *args], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    return res.returncode, res.stdout + res.stderr, time.monotonic() - t0


def _table(out: str, mode: str) -> list[list[str]]:
    """The summary table's five rows: number, part, status, seconds, result."""
    table = out[out.index(f"GPU CHECK SUMMARY ({mode};"):].splitlines()
    return [re.split(r"\s+", r, maxsplit=4) for r in table[2:7]]


def test_dry_run_of_two_parts_prints_the_one_summary_table(tmp_path: Path) -> None:
    """Parts 1 and 4 of ``--dry-run`` (the others SKIP): logs and figures where asked, the table
    names every part. The whole dry run is ``make gpu-rehearsal``'s."""
    logs = tmp_path / "logs"
    rc, out, _ = _check(tmp_path, "--dry-run", "--parts", "1,4")
    assert rc == 0, out
    rows = _table(out, "dry run on CPU, tiny sizes")
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("1", "env", "PASS"),
        ("2", "decode", "SKIP"),
        ("3", "e2e", "SKIP"),
        ("4", "gpu_tests", "PASS"),
        ("5", "parity", "SKIP"),
    ], rows
    assert "no GPU (CPU only)" in rows[0][4] and re.search(r"\d+/\d+ tests collected", rows[3][4]), rows
    assert out.rstrip().endswith("RESULT: PASS")
    assert sorted(p.name for p in logs.iterdir()) == [
        "1_env.log",
        "4_gpu_tests.log",
        "figures.jsonl",
        "summary.txt",
    ]
    assert '"part": "env"' in (logs / "figures.jsonl").read_text()
    assert not list(tmp_path.glob("gpu_check.*"))  # the script removed its work folder


@CPU_ONLY
def test_a_real_run_on_a_cpu_fails_within_seconds(tmp_path: Path) -> None:
    """Not a dry run, on this CPU-only machine: part 1 finds no CUDA device and says why, parts 2-4
    are FAIL without running (no CPU fallback), parity is not tried; the env log still holds what
    the machine is (pip freeze, torch, the offline and cuBLAS variables)."""
    rc, out, secs = _check(tmp_path)
    assert rc != 0 and out.rstrip().endswith("RESULT: FAIL"), out
    assert secs < 60, secs
    rows = _table(out, "GPU")
    assert [(r[1], r[2]) for r in rows] == [("env", "FAIL(1)"), ("decode", "FAIL"), ("e2e", "FAIL"),
                                            ("gpu_tests", "FAIL"), ("parity", "SKIP")], rows
    assert rows[0][4].startswith("NO CUDA: torch ") and "CPU build" in rows[0][4], rows[0]
    assert all(r[4].startswith("not run: no CUDA device (part 1): torch ") for r in rows[1:4]), rows
    assert rows[4][4] == "optional, not run: parts 1-4 did not all pass"
    log = (tmp_path / "logs" / "1_env.log").read_text()
    assert "--- pip freeze" in log and re.search(r"^torch==", log, re.M), log
    assert "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUBLAS_WORKSPACE_CONFIG=:4096:8" in log
    assert not list(tmp_path.glob("gpu_check.*"))  # the script removed its work folder


@CPU_ONLY
def test_gpu_tests_that_all_skipped_are_a_failure(tmp_path: Path) -> None:
    """Part 4 alone on a CPU: pytest exits 0 with every gpu test skipped; the check says FAIL."""
    rc, out, _ = _check(tmp_path, "--parts", "4")
    assert rc != 0 and out.rstrip().endswith("RESULT: FAIL"), out
    row = _table(out, "GPU")[3]
    assert row[2] == "FAIL" and re.match(
        r"\d+ skipped, \d+ deselected: \d+ skipped \(a skipped test", row[4]
    ), row


def _stub(tmp_path: Path, cases: str) -> Path:
    """A stand-in for the GPU machine's python3: ``cases`` (bash case arms on "$1 $2") answer some
    module runs; everything else goes to this interpreter."""
    stub = tmp_path / "python3"
    stub.write_text(f'#!/usr/bin/env bash\ncase "$1 $2" in\n{cases}\nesac\nexec {sys.executable} "$@"\n')
    stub.chmod(0o755)
    return stub


E2E_NO_GRAPHS = ('{"part": "e2e", "rows": 48, "ok": 48, "graph_steps": 0, "decode_steps": 9600, '
                 '"capture_errors": [], "frontend_prompts_per_s": 5.2}')


@pytest.mark.parametrize("figures,why", [
    (E2E_NO_GRAPHS, "no decode step ran as a CUDA graph (graph steps 0/9600)"),
    ("", "the e2e part left no figures")], ids=["zero-graph-steps", "no-figures"])
def test_e2e_that_exits_0_without_graph_steps_is_a_failure(tmp_path: Path, figures: str, why: str) -> None:
    """Part 3 judged on its figures, not its exit status: a stand-in e2e that "succeeds" with no
    decode step replayed as a graph (or no figures at all) reads FAIL with that reason."""
    write = f"echo '{figures}' >>\"$GPU_CHECK_FIGURES\"; " if figures else ""
    py = _stub(tmp_path, f'  "-m benchmarks.gpu_e2e") {write}echo "SUMMARY: 48/48 rows"; exit 0 ;;')
    rc, out, _ = _check(tmp_path, "--parts", "3", py=str(py))
    assert rc != 0 and out.rstrip().endswith("RESULT: FAIL"), out
    row = _table(out, "GPU")[2]
    assert row[2] == "FAIL" and row[4] == why, row


def test_a_hanging_part_is_interrupted_or_killed_and_the_next_still_runs(tmp_path: Path) -> None:
    """The script with short limits (a copy: 2 s parts, KILL 1 s): a part that ignores SIGINT is
    KILLED after limit + KILL, one that dies of it is TIMEOUT, each within its margin."""
    code = _script()
    for old, new in (("LIMITS=(45 55 132 120 50)", "LIMITS=(45 2 2 120 50)"), ("\nKILL=5 ", "\nKILL=1 ")):
        assert old in code, old
        code = code.replace(old, new)
    copy = tmp_path / "repo" / "benchmarks" / "gpu_check.sh"
    copy.parent.mkdir(parents=True)
    (tmp_path / "repo" / "tests").mkdir()
    copy.write_text(code)
    py = _stub(tmp_path, """  "-m benchmarks.gpu_step") trap '' INT; sleep 30; exit 0 ;;
  "-m benchmarks.gpu_e2e") sleep 30; exit 0 ;;""")
    rc, out, secs = _check(tmp_path, "--parts", "2,3", py=str(py), script=copy)
    assert rc != 0 and out.rstrip().endswith("RESULT: FAIL"), out
    rows = _table(out, "GPU")
    assert (rows[1][2], rows[2][2]) == ("KILLED", "TIMEOUT"), rows
    assert rows[1][4].startswith("killed 1 s after its interrupt at 2 s"), rows[1]
    assert int(rows[1][3]) <= 2 + 1 + 2 and int(rows[2][3]) <= 2 + 1 and secs < 20, (rows, secs)


def test_synth_rejects_unknown_cuda_graphs_value(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["synth", str(tmp_path / "m.jsonl"), "--load-format", "dummy",
                                   "--cuda-graphs", "yes"])
    text = " ".join(res.output.replace("│", " ").split())  # the usage box wraps lines
    assert (
        res.exit_code == 2 and "'--cuda-graphs'" in text and "'yes' is not one of 'auto', 'on', 'off'" in text
    ), text


def test_e2e_gives_every_row_a_prompt_of_its_own_of_varied_length(tmp_path: Path) -> None:
    """Part 3's prompts: distinct content per row (each a prompt-cache miss), 5-29 s (within the
    frontend's 30 s; with 375-token targets a row is about the sizing rule's 30 s design row), and
    the warm-up's (another salt, the same lengths: the timed shape) distinct from the timed run's."""
    import hashlib

    import soundfile as sf

    from benchmarks.gpu_e2e import PROMPT_SECONDS, distinct_prompts

    timed = distinct_prompts(tmp_path / "run", 10, salt=2)
    warm = distinct_prompts(tmp_path / "warm", 4, salt=1)
    digests = [hashlib.sha256((tmp_path / "run" / n).read_bytes()).hexdigest() for n in timed]
    digests += [hashlib.sha256((tmp_path / "warm" / n).read_bytes()).hexdigest() for n in warm]
    assert len(set(digests)) == 14
    seconds = [sf.info(str(tmp_path / "run" / n)).duration for n in timed]
    assert {round(x, 1) for x in seconds} == {round(x, 1) for x in PROMPT_SECONDS}
    assert min(seconds) >= 5 and max(seconds) < 30
    assert sum(PROMPT_SECONDS) / len(PROMPT_SECONDS) + 375 / 25 >= 30  # the check's rows reach the design row
    warm_seconds = [sf.info(str(tmp_path / "warm" / n)).duration for n in warm]
    assert warm_seconds == seconds[:4]


def test_the_decode_part_measures_the_sized_slots_once() -> None:
    """``--batches 1,64,sized``: the sized count is what a run on this device plans (here a CPU: its
    batch), each batch measured once."""
    from benchmarks.gpu_step import batch_sizes
    from cosyclone.base.device import resolve

    assert batch_sizes("1,64,sized", resolve("cpu", "fp32")) == ([1, 64, 8], 8)
    assert batch_sizes("1,8,sized", resolve("cpu", "fp32")) == ([1, 8], 8)
    assert batch_sizes("1,3", resolve("cpu", "fp32")) == ([1, 3], None)
