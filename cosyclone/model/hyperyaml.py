"""Read a HyperPyYAML file (``cosyvoice3.yaml``) as plain data, never as code.

HyperPyYAML's tags (``!new:pkg.Class``, ``!name:pkg.func``, ``!apply:pkg.func``, ``!ref <key>``)
normally import and call what they name. A model directory is untrusted data, so here every tag
becomes an inert :class:`Tagged` node that records the tag, the dotted target and its arguments,
and ``!ref`` expressions are resolved against the document with a tiny arithmetic evaluator
(finite numbers up to 2**63 and ``+ - * / //`` only: no strings, so no string repetition). Nothing
named in the file is imported or executed, and no value it builds can grow without bound.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from cosyclone.errors import ModelDirError


@dataclass
class Tagged:
    """An inert stand-in for a ``!new:`` / ``!name:`` / ``!apply:`` node."""

    kind: str  # "new", "name" or "apply"
    target: str  # the dotted path the tag names (never imported)
    args: dict[str, Any] = field(default_factory=dict)
    positional: list[Any] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.args[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.args.get(key, default)


@dataclass
class Ref:
    """An unresolved ``!ref`` expression such as ``<chunk_size> * <token_mel_ratio>``."""

    expr: str


class _DataLoader(yaml.SafeLoader):
    """SafeLoader that turns HyperPyYAML tags into data."""


def _tagged(kind: str) -> Callable[[yaml.SafeLoader, str, yaml.Node], Tagged]:
    def construct(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Tagged:
        if isinstance(node, yaml.MappingNode):
            return Tagged(
                kind, suffix, args={str(k): v for k, v in loader.construct_mapping(node, deep=True).items()}
            )
        if isinstance(node, yaml.SequenceNode):
            return Tagged(kind, suffix, positional=loader.construct_sequence(node, deep=True))
        if not isinstance(node, yaml.ScalarNode):  # what yaml itself says of a node it cannot take
            raise yaml.constructor.ConstructorError(None, None, f"!{kind}: unexpected node", node.start_mark)
        value = loader.construct_scalar(node)
        return Tagged(kind, suffix, positional=[] if value in ("", None) else [value])

    return construct


for _kind in ("new", "name", "apply"):
    _DataLoader.add_multi_constructor(f"!{_kind}:", _tagged(_kind))
def _ref(loader: yaml.SafeLoader, node: yaml.Node) -> Ref:
    if not isinstance(node, yaml.ScalarNode):
        raise yaml.constructor.ConstructorError(None, None, "!ref takes a scalar", node.start_mark)
    return Ref(str(loader.construct_scalar(node)))


_DataLoader.add_constructor("!ref", _ref)
# yaml 1.1 reads "1e-06" as a string; accept it as a float like HyperPyYAML (ruamel) does.
_DataLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)$"),
    list("-+0123456789"),
)

_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
# Largest magnitude an arithmetic !ref may produce or consume. The released yaml multiplies two
# small ints (``<chunk_size> * <token_mel_ratio>``); the bound keeps a hostile file from building
# huge integers by chained multiplication (2**63 is what a config value can sensibly be).
MAX_MAGNITUDE = 2**63


def _number(value: Any, expr: str) -> int | float:
    """An operand or result of ``!ref`` arithmetic: a finite int/float within MAX_MAGNITUDE."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"!ref arithmetic on a {type(value).__name__} ({value!r:.40}) in {expr!r}: "
                         "only numbers may be combined")
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"!ref arithmetic out of range in {expr!r} (|value| must be <= 2**63)")
    return value


def _eval_arith(expr: str) -> int | float:
    """Evaluate numbers and + - * / // only; strings, names and calls are errors, never executed.

    Every operand and every intermediate result is checked by :func:`_number`, so ``'x' * 10**9``
    (a string repeated) or a chain of multiplications cannot build an object of unbounded size.
    """
    if len(expr) > 1000:
        raise ValueError(f"!ref expression too long ({len(expr)} characters)")

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return _number(node.value, expr)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _number(_OPS[type(node.op)](ev(node.left), ev(node.right)), expr)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _number(_OPS[type(node.op)](ev(node.operand)), expr)
        raise ValueError(f"unsupported expression element {ast.dump(node)} in {expr!r}")

    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse !ref expression {expr!r}: {exc.msg}") from None
    return ev(tree)


_REF = re.compile(r"<([^<>]+)>")


def _lookup(doc: dict[str, Any], dotted: str) -> Any:
    node: Any = doc
    for part in dotted.replace("[", ".").replace("]", "").split("."):
        if isinstance(node, Tagged):
            node = node.args[part]
        elif isinstance(node, list):
            node = node[int(part)]
        else:
            node = node[part]
    return node


class _Resolver:
    """Resolves ``!ref`` nodes; each referenced key is resolved once (memoized), cycles are errors.

    Without the memo a chain of keys each referring twice to the previous one would cost 2**n
    evaluations for n keys.
    """

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.memo: dict[str, Any] = {}
        self.active: set[str] = set()

    def ref(self, key: str, depth: int) -> Any:
        if key in self.memo:
            return self.memo[key]
        if key in self.active:
            raise ValueError(f"!ref cycle through <{key}>")
        self.active.add(key)
        try:
            value = self.resolve(_lookup(self.doc, key), depth + 1)
        finally:
            self.active.discard(key)
        self.memo[key] = value
        return value

    def resolve(self, node: Any, depth: int = 0) -> Any:
        if depth > 50:
            raise ValueError("!ref nesting too deep")
        if isinstance(node, Ref):
            refs = _REF.findall(node.expr)
            if len(refs) == 1 and node.expr.strip() == f"<{refs[0]}>":
                return self.ref(refs[0], depth)
            values = {r: _number(self.ref(r, depth), node.expr) for r in refs}
            text = _REF.sub(lambda m: repr(values[m.group(1)]), node.expr)
            return _eval_arith(text)
        if isinstance(node, Tagged):
            node.args = {k: self.resolve(v, depth + 1) for k, v in node.args.items()}
            node.positional = [self.resolve(v, depth + 1) for v in node.positional]
            return node
        if isinstance(node, dict):
            return {k: self.resolve(v, depth + 1) for k, v in node.items()}
        if isinstance(node, list):
            return [self.resolve(v, depth + 1) for v in node]
        return node


def load_hyperyaml(path: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse ``path`` into plain data with every ``!ref`` resolved; tags become :class:`Tagged`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        doc = yaml.load(text, Loader=_DataLoader)  # noqa: S506 - a SafeLoader subclass
    except (OSError, yaml.YAMLError) as exc:
        raise ModelDirError(f"{path}: cannot read as YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ModelDirError(f"{path}: expected a mapping at the top level")
    doc.update(overrides or {})
    try:
        return cast("dict[str, Any]", _Resolver(doc).resolve(doc))
    except (KeyError, ValueError, IndexError, TypeError) as exc:
        raise ModelDirError(f"{path}: cannot resolve a !ref: {exc}") from exc
