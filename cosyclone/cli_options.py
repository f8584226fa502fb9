"""Command-line parameters derived from :mod:`cosyclone.options`, so no option is declared twice.

A command declares only what is its own (``synth``'s manifest, ``say``'s text) and takes the rest as
``**options``; :func:`with_options` adds one typer option per field that lists the command in its ``commands``
metadata, with the field's flag, one-line help, ``--help`` panel and (for ``Literal`` fields) its choices;
bounds are checked by :func:`cosyclone.options.check`, the one check every door shares, so the error names the
flag the same way everywhere. Typer reads the command's ``__signature__``, so the derived options parse, check
and show in ``--help`` exactly like hand-written ones.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from cosyclone.commands.options import DOOR_GROUPS
from cosyclone.eval.options import ScoringOptions
from cosyclone.export.options import ExportOptions
from cosyclone.manifest.options import ValidateOptions
from cosyclone.options import GROUPS, choices_of, flag_of, hints_of, option_fields
from cosyclone.report.options import ReportOptions
from cosyclone.trace.options import TraceOptions

#: Every option group a command takes its options from: a run's, export's, the doors', validate's, eval's
#: and trace's.
ALL_GROUPS: tuple[type, ...] = (*GROUPS, ExportOptions, ReportOptions, *DOOR_GROUPS, ValidateOptions,
                               ScoringOptions, TraceOptions)

F = TypeVar("F", bound=Callable[..., Any])


def _annotation(owner: type, name: str) -> Any:
    """The runtime type typer should parse a field as (``X | None`` as ``X | None``, once)."""
    hint = hints_of(owner)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args and len(args) == 1:  # X | None
        return args[0] | None
    return hint


def derived_parameters(command: str) -> list[inspect.Parameter]:
    """One keyword-only parameter per option the command offers."""
    params = []
    for owner, f in option_fields(*ALL_GROUPS):
        if command not in f.metadata.get("commands", ()):
            continue
        meta = f.metadata
        choices = choices_of(f, owner)
        annotation = _annotation(owner, f.name)
        if choices is not None:
            annotation = typing.Literal[choices]  # typer offers exactly these values
        default: Any = f.default
        if meta.get("required"):  # typer marks it [required] and refuses a call without it
            default = ...
            annotation = next(a for a in typing.get_args(annotation) or (annotation,) if a is not type(None))
        decls = [flag_of(f), *([meta["short"]] if meta.get("short") else [])]
        # no min/max here: bounds are options.check's, so every door words the error the same way
        option = typer.Option(
            default,
            *decls,
            help=meta["help"],
            rich_help_panel=meta["panel"],
            metavar=meta.get("metavar"),
            hidden=meta.get("hidden", False),
            show_default=False,
            envvar=meta.get("envvar"),
            show_envvar=False,
        )
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                        annotation=annotation))
    return params


def with_options(command: str) -> Callable[[F], F]:
    """Give ``fn`` (which takes ``**options``) the derived options of ``command`` as parameters."""

    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        fn.__signature__ = sig.replace(parameters=own + derived_parameters(command))  # type: ignore[attr-defined]
        fn.__annotations__ = {}  # typer must read the signature's resolved annotations, not the strings
        return fn

    return wrap
