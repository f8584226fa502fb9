"""Imports run one way, down the layers: no module imports a layer above its own, and only the doors
and the base sit at the package's top level.

Every ``import`` and ``from`` statement is read (relative ones resolved against the module's own
package, ``from .. import x`` included), at module level or inside a function alike: a lazy import
up a layer is still an import up a layer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "cosyclone"

#: Each unit (a subpackage, or a top-level module) and its layer: a unit may import units of its own
#: layer's rank or lower, never higher. Doors: the commands and the Python facade; base: what every
#: layer may use.
LAYERS: dict[str, int] = {
    "cosyclone": 11, "cosyclone.cli": 11, "cosyclone.cli_options": 11, "cosyclone.api": 11,  # doors
    "cosyclone.commands": 11,  # the doors' own commands (synth, say, validate, inspect, make-tiny-model)
    "cosyclone.export": 10,  # run folders' good rows as a training set (cosyclone export; above eval)
    "cosyclone.eval": 9,  # scoring a finished folder (cosyclone eval)
    "cosyclone.report": 10,  # a folder's totals and its HTML page (cosyclone report; reads eval's records,
    # embeds a row's prompt as export does)
    "cosyclone.trace": 9,  # one row of a folder replayed eagerly with hooks (cosyclone trace)
    "cosyclone.run": 8,  # a run into a folder: plan, resume, the one driver loop, account
    "cosyclone.ray": 7,  # Ray as a row source for a run: the sizing rule, the actor pool, its actors
    "cosyclone.folder": 6,  # the run folder as a store: layout, records, index, writer, lock, totals
    "cosyclone.engine": 5,  # rows in, results out on a loaded model
    "cosyclone.manifest": 4,  # lines in, validated rows out (asks the frontend's normalizer)
    "cosyclone.frontend": 3, "cosyclone.talker": 3, "cosyclone.code2wav": 3,  # the stages
    "cosyclone.model": 2,  # configuration, checkpoints, the fused projections
    "cosyclone.options": 1, "cosyclone.errors": 0, "cosyclone.base": 1,  # the base
}
TOP_LEVEL = {"__init__.py", "api.py", "cli.py", "cli_options.py", "options.py", "errors.py"}


def _unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else module


def _imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path`` (a file of the package under ``root``)."""
    package = list(path.relative_to(root).with_suffix("").parts[:-1])
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from cosyclone import run`` imports the unit cosyclone.run, not the package root
            found += [
                (node.lineno, f"{module}.{a.name}" if module == "cosyclone" else module) for a in node.names
            ]
    return [(line, m) for line, m in found if m == "cosyclone" or m.startswith("cosyclone.")]


def test_every_unit_has_a_layer() -> None:
    units = {_unit(".".join(p.relative_to(ROOT).with_suffix("").parts)) for p in PKG.rglob("*.py")}
    units = {u.removesuffix(".__init__") for u in units}
    assert units <= set(LAYERS), f"give these a layer: {sorted(units - set(LAYERS))}"


def test_no_module_imports_a_layer_above_its_own() -> None:
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        own = _unit(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
        for line, module in _imports(path):
            target = _unit(module)
            if target in LAYERS and target != own and LAYERS[target] > LAYERS[own]:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({own}, layer {LAYERS[own]}) imports {module} "
                           f"(layer {LAYERS[target]})")
    assert not bad, "\n".join(bad)


def test_only_the_doors_and_the_base_sit_at_the_top_level() -> None:
    assert {p.name for p in PKG.glob("*.py")} <= TOP_LEVEL


def test_the_reader_sees_relative_imports_too(tmp_path: Path) -> None:
    """The layering test itself: ``from .. import x`` and ``from ..run import y`` resolve to their units."""
    probe = tmp_path / "cosyclone" / "engine" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "from .. import run\nfrom ..api import CosyClone\nfrom . import stages\nimport cosyclone.base\n"
    )
    assert [m for _, m in _imports(probe, tmp_path)] == [
        "cosyclone.run", "cosyclone.api", "cosyclone.engine", "cosyclone.base"]
