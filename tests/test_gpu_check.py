"""The GPU check's pieces that run anywhere, without network or GPU: the wheel bundle's checker
(benchmarks/gpu_bundle.py) on hand-made wheels, the real pins against pyproject.toml and the image's
list, the structure of benchmarks/gpu_check.sh, and a short dry run of two of its parts that prints
the one summary table. ``make gpu-rehearsal`` runs the whole dry run in a fresh venv."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from typer.testing import CliRunner

from benchmarks import gpu_bundle as gb
from cosyclone.cli import app

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _wheel(folder: Path, name: str, version: str, requires: list[str] = (), tag: str = "py3-none-any",  # type: ignore[assignment]
           pad: int = 0) -> gb.Wheel:
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    meta = "\n".join([f"Name: {name}", f"Version: {version}", *[f"Requires-Dist: {r}" for r in requires]])
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "Metadata-Version: 2.1\n" + meta + "\n")
        if pad:
            z.writestr("pad.bin", os.urandom(pad))
    return gb.read_wheel(path)


def test_checker_accepts_a_complete_bundle_and_names_each_problem(tmp_path: Path) -> None:
    image = {"numpy": "2.5.2", "typing-extensions": None}
    pins = {"soundfile": "0.14.0", "cffi": "2.1.1", "pycparser": "3.12"}
    good = [_wheel(tmp_path, "soundfile", "0.14.0", ["cffi>=1.0", "numpy", "typing-extensions"],
                   tag="py2.py3-none-manylinux_2_28_x86_64"),
            _wheel(tmp_path, "cffi", "2.1.1", ['pycparser; implementation_name != "PyPy"'],
                   tag="cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64"),
            _wheel(tmp_path, "pycparser", "3.12", ['pytest; extra == "test"', 'tomli; python_version < "3.11"'])]
    roots = ["soundfile>=0.12", "numpy>=1.24"]
    assert gb.check(good, pins, image, "3.12", roots) == []
    # the same wheels for another Python: a cp312 build does not install on 3.11
    assert gb.check(good, pins, image, "3.11", roots) == [
        "cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl does not install on CPython 3.11 "
        "x86-64 Linux"]
    # a requirement nobody meets, one the image's known version does not meet, a wheel too many
    other = tmp_path / "other"
    other.mkdir()
    bad = [*good, _wheel(other, "numpy", "2.4.0"), _wheel(other, "cffi", "2.0.0")]
    problems = gb.check(bad, pins, image, "3.12", [*roots, "wetext==0.1.8", "numpy>=3"])
    assert any(p.startswith("two wheels for cffi:") for p in problems), problems
    assert "numpy is on the image already: bundling it would shadow the image's" in problems
    assert any(p.startswith("numpy-2.4.0-py3-none-any.whl is not pinned") for p in problems)
    assert any(p.startswith("cosyclone needs wetext==0.1.8: neither bundled nor on the image") for p in problems)
    assert any(p.startswith("cosyclone needs numpy>=3") for p in problems), problems
    # a pin without its wheel, a wheel of another version than its pin
    assert gb.check(good[:2], pins, image, "3.12", roots) == ["no wheel for the pin pycparser==3.12",
                                                               'cffi needs pycparser; implementation_name != "PyPy": '
                                                               "neither bundled nor on the image (add it to "
                                                               "gpu_bundle_pins.txt)"]
    assert gb.check(good, {**pins, "cffi": "2.0"}, image, "3.12", roots) == [
        "cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl is 2.1.1, pinned 2.0"]


def test_checker_refuses_a_bundle_over_its_limit(tmp_path: Path) -> None:
    w = _wheel(tmp_path, "big", "1.0", pad=300_000)
    assert gb.check([w], {"big": "1.0"}, {}, "3.12", [], limit_mb=0.25) == [
        f"the bundle is {w.path.stat().st_size / 2**20:.1f} MB, over the 0.25 MB limit"]
    assert gb.check([w], {"big": "1.0"}, {}, "3.12", [], limit_mb=1) == []


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
    assert {"soundfile", "wetext", "inflect", "torch", "transformers", "onnxruntime"} <= set(pins) | set(image)
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0"


def _script() -> str:
    return SCRIPT.read_text()


def test_script_uses_the_machines_python_and_installs_only_the_bundle() -> None:
    text = _script()
    code = "\n".join(line for line in text.replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#"))
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert "make install" not in code and "venv" not in code  # no isolated venv, the image's torch stays visible
    installs = [line for line in code.splitlines() if "pip install" in line]
    assert len(installs) == 1 and "--no-index" in installs[0] and "--no-deps" in installs[0], installs
    assert "--target" in installs[0] and "torch" not in installs[0]
    assert 'PY=${PY:-python3}' in code


def test_script_runs_five_parts_in_order_each_under_an_interrupting_timeout() -> None:
    code = _script()
    parts = re.findall(r"^run_part (\d) (\w+) ", code, re.M)
    assert parts == [("1", "env"), ("2", "decode"), ("3", "e2e"), ("4", "gpu_tests"), ("5", "parity")]
    kill = re.search(r"timeout --signal=INT --kill-after=(\d+) ", code)
    install = re.search(r"timeout (\d+) \"\$PY\" -m pip install", code)
    gpu = re.search(r"LIMITS=\(([\d ]+)\)\n  STEP_ARGS=\(--dtype bf16", code)
    assert kill and install and gpu
    # the worst case on the GPU, every part interrupted and then killed, the install timed out: under 8 minutes
    assert sum(map(int, gpu.group(1).split())) + 5 * int(kill.group(1)) + int(install.group(1)) <= 8 * 60
    # files back from $OUT: one log per part, figures.jsonl, summary.txt (the device returns 8 at most)
    assert len(parts) + 2 <= 8 and "figures.jsonl" in code and "summary.txt" in code


def test_script_picks_exactly_the_files_holding_gpu_tests() -> None:
    """Part 4 runs only the files with gpu-marked tests (``-m gpu`` over every module would import
    modules that need packages the check does not use)."""
    line = next(x for x in _script().splitlines() if x.startswith("mapfile -t GPU_FILES"))
    cmd = line.split("< <(", 1)[1].rsplit(")", 1)[0]
    found = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    want = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if re.search(r"pytest\.mark\.gpu\b", p.read_text()))
    assert found == want and "tests/test_cuda_graphs.py" in found


def test_dry_run_of_two_parts_prints_the_one_summary_table(tmp_path: Path) -> None:
    """Parts 1 and 4 of ``--dry-run`` (the others SKIP): logs and figures where asked, the table
    names every part. The whole dry run is ``make gpu-rehearsal``'s."""
    logs = tmp_path / "logs"
    env = {**os.environ, "PY": sys.executable, "TMPDIR": str(tmp_path), "GPU_CHECK_LOGS": str(logs),
           "BUNDLE": str(tmp_path / "no-bundle")}
    env.pop("OUT", None)
    res = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--parts", "1,4"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    table = out[out.index("GPU CHECK SUMMARY (dry run on CPU, tiny sizes;"):].splitlines()
    rows = [re.split(r"\s+", r, maxsplit=4) for r in table[2:7]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("1", "env", "PASS"), ("2", "decode", "SKIP"), ("3", "e2e", "SKIP"),
                                                  ("4", "gpu_tests", "PASS"), ("5", "parity", "SKIP")], table
    assert "no GPU (CPU only)" in rows[0][4] and re.search(r"\d+/\d+ tests collected", rows[3][4]), rows
    assert sorted(p.name for p in logs.iterdir()) == ["1_env.log", "4_gpu_tests.log", "figures.jsonl", "summary.txt"]
    assert '"part": "env"' in (logs / "figures.jsonl").read_text()
    assert not list(tmp_path.glob("gpu_check.*"))  # the script removed its work folder


def test_synth_rejects_unknown_cuda_graphs_value(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["synth", str(tmp_path / "m.jsonl"), "--load-format", "dummy",
                                   "--cuda-graphs", "on"])
    text = " ".join(res.output.replace("│", " ").split())  # the usage box wraps lines
    assert res.exit_code == 2 and "'--cuda-graphs'" in text and "'on' is not one of 'auto', 'off'" in text, text
