"""``--help`` reads at 80 columns, and the CLI's run options are the typed option set's, not a copy."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cosyclone import cli
from cosyclone.cli_options import ALL_GROUPS
from cosyclone.options import SAY, SYNTH, flag_of, option_fields

PANELS = ("Model", "Sampling", "Batching", "Output", "Scale-out")


def _help(command: str) -> str:
    res = CliRunner().invoke(
        cli.app, [command, "--help"], env={"COLUMNS": "80", "TERM": "dumb"}, terminal_width=80
    )
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("command", [SYNTH, SAY])
def test_help_is_short_grouped_and_fits_80_columns(command: str) -> None:
    text = _help(command)
    lines = text.splitlines()
    assert len(lines) <= 120, len(lines)
    assert all(len(line) <= 80 for line in lines)
    panels = re.findall(r"╭─ ([\w-]+) ─", text)
    assert set(PANELS) - {"Scale-out", "Batching"} <= set(panels)
    if command == SYNTH:
        assert set(PANELS) <= set(panels)
    # an option's help is one line: a row whose first cell is empty continues the previous one
    wrapped = [line for line in lines if re.match(r"^│\s{20,}\S", line)]
    assert len(wrapped) <= 2, wrapped


@pytest.mark.parametrize("command,fn", cli.COMMANDS, ids=[name for name, _ in cli.COMMANDS])
def test_every_commands_options_come_from_the_registry(command: str, fn: Any) -> None:
    """Each option of each command is a registry field's (flag, help, panel, default), none hand-written:
    only positional arguments are a command's own."""
    params = inspect.signature(fn).parameters
    offered = {f.name: f for _, f in option_fields(*ALL_GROUPS) if command in f.metadata["commands"]}
    for name, param in params.items():
        info = param.default
        if isinstance(info, typer.models.ArgumentInfo):
            continue
        assert name in offered, f"{command} --{name} is declared by hand, not in the option registry"
    for name, f in offered.items():
        info = params[name].default
        assert info.param_decls[0] == flag_of(f) and info.help == f.metadata["help"], name
        assert info.rich_help_panel == f.metadata["panel"]
        assert info.default == (... if f.metadata.get("required") else f.default)


def test_every_command_is_registered_with_its_options() -> None:
    registered = {c.name for c in cli.app.registered_commands}
    assert registered == {name for name, _ in cli.COMMANDS}
    assert {c for _, f in option_fields(*ALL_GROUPS) for c in f.metadata["commands"]} <= registered


def test_a_bound_is_checked_once_for_every_door(tmp_path) -> None:
    """Bounds are options.check's: the CLI's message is the API's (exit 2, the flag named)."""
    from cosyclone.errors import CosycloneError
    from cosyclone.options import RunOptions

    res = CliRunner().invoke(
        cli.app, ["synth", "missing.jsonl", "--top-k", "0", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2 and "--top-k must be at least 1, not 0" in res.output
    with pytest.raises(CosycloneError, match="--top-k must be at least 1, not 0"):
        RunOptions(top_k=0)
