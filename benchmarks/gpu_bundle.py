"""The wheel bundle a bare, offline GPU machine needs, built where the package index is reachable.

Why: a lent GPU machine (tool library, device) has python3 with CUDA torch, transformers,
onnxruntime, numpy, pytest... but no network and not soundfile, wetext or inflect, without which
``cosyclone synth``/``say`` and the gpu-marked tests cannot start. Only the working tree travels,
so the missing wheels travel in it: exactly the pinned closure in ``gpu_bundle_pins.txt``, one
wheel per name, for the target machine's Python, checked against what the image already holds
(``gpu_image_packages.txt``) so that the bundle is complete without pip resolving anything there
(``pip install --no-index --no-deps --target`` installs it as it is).

Usage (from the repo root; ``make gpu-bundle PYVER=3.12`` runs ``build``)::

    python -m benchmarks.gpu_bundle build --python-version 3.12 [--dest .gpu-bundle/py312] [--reference DIR]
    python -m benchmarks.gpu_bundle check --python-version 3.12 [--dest .gpu-bundle/py312]
    python -m benchmarks.gpu_bundle installed --bundle DIR   # on the machine: every requirement satisfied?

``check`` needs no network: it reads the wheels' own metadata. The bundle is refused over 20 MB.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
except ImportError:  # pragma: no cover - pip vendors packaging
    from pip._vendor.packaging.markers import Marker  # type: ignore[assignment]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "benchmarks" / "gpu_bundle_pins.txt"
IMAGE = ROOT / "benchmarks" / "gpu_image_packages.txt"
LIMIT_MB = 20.0
#: What the parity part reads from the reference folder (tests/reference.py finds them beside each other).
REFERENCE_PARTS = ("vectors", "tokenizer", "state_dicts")
#: What the gpu check needs beyond cosyclone's own dependencies (its test parts).
CHECK_NEEDS = ("pytest", "hypothesis")
#: Requirements of bundled wheels that nothing the check runs imports, so neither bundled nor
#: required: the name and why (``check`` and ``installed`` pass over them, saying so).
UNUSED = {
    "pre-commit": "s3tokenizer lists its own development hooks",
    "modelscope": "speakerlab-slim's hub downloads; the check builds CAM++ with random weights",
    "torchaudio": "s3tokenizer's audio loader, never called (on the image; none is built for torch 2.13)",
}
#: Platforms of the device's x86-64 Linux (pip matches each manylinux tag exactly).
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)


def canonical(name: str) -> str:
    """PEP 503 name: ``jaraco.functools`` and ``Jaraco_Functools`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_list(path: Path) -> dict[str, str | None]:
    """``name`` or ``name==version`` lines (``#`` comments) -> {canonical name: version or None}."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        out[canonical(name.strip())] = version.strip() or None
    return out


@dataclass
class Wheel:
    """One wheel file's name, version, tags and requirements (from its METADATA)."""

    path: Path
    name: str
    version: str
    requires: list[str] = field(default_factory=list)

    @property
    def tags(self) -> tuple[str, str, str]:
        """(python, abi, platform) tags of the file name."""
        parts = self.path.name[:-4].split("-")
        return parts[-3], parts[-2], parts[-1]


def read_wheel(path: Path) -> Wheel:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode("utf-8", "replace"))
    return Wheel(path=path, name=canonical(msg["Name"]), version=str(msg["Version"]),
                 requires=list(msg.get_all("Requires-Dist") or []))


def target_env(python_version: str) -> dict[str, str]:
    """Marker environment of the device: CPython ``python_version`` on x86-64 Linux, no extras."""
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "implementation_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "platform_release": "",
        "platform_version": "",
        "extra": "",
    }


def needed(requires: list[str], python_version: str) -> list[Requirement]:
    """The requirements that apply on the device (markers evaluated, extras left out)."""
    env = target_env(python_version)
    return [r for r in map(Requirement, requires) if r.marker is None or Marker(str(r.marker)).evaluate(env)]


def project_requirements() -> list[str]:
    """cosyclone's runtime dependencies (pyproject.toml) and what the check's test parts import."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [*deps, *CHECK_NEEDS]


def _tag_ok(w: Wheel, python_version: str) -> bool:
    py, abi, plat = w.tags
    cp = "cp" + python_version.replace(".", "")
    py_ok = any(t in (cp, "py3", "py" + python_version.replace(".", "")) for t in py.split("."))
    abi_ok = any(t in (cp, "abi3", "none") for t in abi.split("."))
    plat_ok = all(t == "any" or t.endswith("x86_64") and ("manylinux" in t or t.startswith("linux"))
                  for t in plat.split("."))
    return py_ok and abi_ok and plat_ok


def check(wheels: list[Wheel], pins: dict[str, str | None], image: dict[str, str | None], python_version: str,
          roots: list[str], limit_mb: float = LIMIT_MB) -> list[str]:
    """Every problem with a bundle (empty: complete). ``roots``: requirements that must hold on
    the device (cosyclone's and the check's); each requirement of them and of every wheel must be
    met by a bundled wheel or by a package on the image's list (its version too, where known)."""
    problems: list[str] = []
    by_name: dict[str, Wheel] = {}
    for w in wheels:
        if w.name in by_name:
            problems.append(f"two wheels for {w.name}: {by_name[w.name].path.name}, {w.path.name}")
        by_name[w.name] = w
        if not _tag_ok(w, python_version):
            problems.append(f"{w.path.name} does not install on CPython {python_version} x86-64 Linux")
        if w.name not in pins:
            problems.append(f"{w.path.name} is not pinned in {PINS.name}")
        if w.name in image:
            problems.append(f"{w.name} is on the image already: bundling it would shadow the image's")
    for name, version in pins.items():
        pinned = by_name.get(name)
        if pinned is None:
            problems.append(f"no wheel for the pin {name}=={version}")
        elif version is not None and pinned.version != version:
            problems.append(f"{pinned.path.name} is {pinned.version}, pinned {version}")

    def meets(req: Requirement, who: str) -> None:
        name = canonical(req.name)
        if name in UNUSED and who != "cosyclone":
            return
        if name in by_name:
            have: str | None = by_name[name].version
        elif name in image:
            have = image[name]
        else:
            problems.append(f"{who} needs {req}: neither bundled nor on the image (add it to {PINS.name})")
            return
        if (
            have is not None
            and req.specifier
            and not SpecifierSet(str(req.specifier)).contains(have, prereleases=True)
        ):
            problems.append(f"{who} needs {req}, the {'bundle' if name in by_name else 'image'} has {have}")

    for req in needed(roots, python_version):
        meets(req, "cosyclone")
    for w in wheels:
        for req in needed(w.requires, python_version):
            meets(req, w.name)
    mb = sum(w.path.stat().st_size for w in wheels) / 2**20
    if mb > limit_mb:
        problems.append(f"the bundle is {mb:.1f} MB, over the {limit_mb:g} MB limit")
    return problems


def _wheels(dest: Path) -> list[Wheel]:
    return [read_wheel(p) for p in sorted(dest.glob("*.whl"))]


def _report(dest: Path, python_version: str) -> int:
    wheels = _wheels(dest)
    problems = check(wheels, read_list(PINS), read_list(IMAGE), python_version, project_requirements())
    mb = sum(w.path.stat().st_size for w in wheels) / 2**20
    for w in wheels:
        print(f"  {w.path.stat().st_size / 2**20:6.2f} MB  {w.path.name}")
    print(
        f"bundle {dest}: {len(wheels)} wheels, {mb:.2f} MB (limit {LIMIT_MB:g} MB), CPython {python_version}"
    )
    for p in problems:
        print(f"PROBLEM: {p}")
    print("bundle check: " + ("FAIL" if problems else "OK (every requirement is bundled or on the image)"))
    return 1 if problems else 0


def build(args: argparse.Namespace) -> int:
    """Download the pinned wheels (no dependencies: the pins are the closure) and check them."""
    dest = Path(args.dest or f".gpu-bundle/py{args.python_version.replace('.', '')}")
    pins = read_list(PINS)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
               "--python-version", args.python_version, "--implementation", "cp", "--abi",
               "cp" + args.python_version.replace(".", ""), "--abi", "abi3", "--abi", "none",
               *[a for p in PLATFORMS for a in ("--platform", p)], "-d", tmp,
               *[f"{n}=={v}" if v else n for n, v in pins.items()]]
        print("$ " + " ".join(cmd[:4]) + " ... " + " ".join(cmd[-len(pins):]), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob("*.whl"):
            old.unlink()
        for w in Path(tmp).glob("*.whl"):
            shutil.move(str(w), dest / w.name)
    if args.reference:
        src, to = Path(args.reference), dest.parent / "reference"
        if (src / "vectors").is_dir():
            for part in REFERENCE_PARTS:
                if (src / part).is_dir():
                    shutil.copytree(src / part, to / part, dirs_exist_ok=True)
            mb = sum(p.stat().st_size for p in to.rglob("*") if p.is_file()) / 2**20
            print(
                f"reference material ({', '.join(REFERENCE_PARTS)}) copied to {to}, {mb:.1f} MB "
                f"(the parity part)"
            )
        else:
            print(f"no reference vectors under {src}: the parity part will skip the tests that need them")
    return _report(dest, args.python_version)


def installed(args: argparse.Namespace) -> int:
    """On the machine: each bundled wheel's requirements and cosyclone's, against what is importable
    now (bundle on PYTHONPATH): name and version, as pip would have resolved them."""
    from importlib import metadata

    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    reqs = [("cosyclone", r) for r in needed(project_requirements(), pyver)]
    for w in _wheels(Path(args.bundle)):
        reqs += [(w.name, r) for r in needed(w.requires, pyver)]
    bad: list[str] = []
    seen: dict[str, str] = {}
    for who, req in reqs:
        if canonical(req.name) in UNUSED and who != "cosyclone":
            continue
        try:
            have = seen.setdefault(req.name, metadata.version(req.name))
        except metadata.PackageNotFoundError:
            bad.append(f"{who} needs {req}: not installed")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            bad.append(f"{who} needs {req}, found {have}")
    print("versions: " + json.dumps(dict(sorted(seen.items()))))
    for b in bad:
        print(f"REQUIREMENT: {b}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("build", "check"):
        p = sub.add_parser(name)
        p.add_argument("--python-version", default="3.12", help="the target machine's Python (device: 3.12)")
        p.add_argument("--dest", default=None, help="default .gpu-bundle/pyXY (git-ignored)")
        if name == "build":
            p.add_argument(
                "--reference",
                default=None,
                help="also copy this reference folder's vectors, tokenizer and state_dicts beside the bundle",
            )
    p = sub.add_parser("installed")
    p.add_argument("--bundle", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "build":
        return build(args)
    if args.cmd == "check":
        return _report(
            Path(args.dest or f".gpu-bundle/py{args.python_version.replace('.', '')}"), args.python_version
        )
    return installed(args)


if __name__ == "__main__":
    sys.exit(main())
