"""A CLI that explains itself: every command's --help describes every option and argument
and shows at least one example; `python -m netrun` is the same command."""
from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from netrun.cli import cli


def _commands(group: click.Group, path: tuple[str, ...]) -> list[tuple[tuple[str, ...],
                                                                        click.Command]]:
    """(argv to the command, the command) for the group and every command under it."""
    out: list = [(path, group)]
    ctx = click.Context(group, info_name=path[-1] if path else "netrun")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, f"{name} is listed but does not load"
        if isinstance(command, click.Group):
            out += _commands(command, (*path, name))
        else:
            out.append(((*path, name), command))
    return out


COMMANDS = _commands(cli, ())
IDS = [" ".join(("netrun", *p)) for p, _ in COMMANDS]


def test_every_command_is_walked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"", "train", "infer", "inspect", "ops", "convert", "algos", "algos list",
            "algos clear", "export", "draw", "plot", "profile", "data", "data build",
            "data mean", "data describe"} <= names


@pytest.mark.parametrize("path,command", COMMANDS, ids=IDS)
def test_help_has_an_example_and_describes_every_option(path, command):
    result = CliRunner().invoke(cli, [*path, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "Example" in text, f"`netrun {' '.join(path)} --help` shows no example"
    # Each example is a command line of this very command.
    assert f"netrun {' '.join(path)}".strip() in text.split("Example", 1)[1]
    undocumented = [o.opts[-1] for o in command.params
                    if isinstance(o, click.Option) and not o.hidden and not (o.help or "").strip()]
    assert not undocumented, f"options without help text: {undocumented}"
    for argument in (p for p in command.params if isinstance(p, click.Argument)):
        name = argument.make_metavar(click.Context(command)).rstrip(".").strip("[]")
        assert name.split("|")[0].lower() in (command.help or "").lower(), \
            f"argument {name} is not described in the help text"
    assert "..." not in command.get_short_help_str(80), \
        f"the command list cuts `{' '.join(path)}`'s summary short: give it a short_help"


def test_python_dash_m_netrun_is_the_command(tmp_path):
    for module in ("netrun", "netrun.cli"):
        result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                                text=True, cwd=tmp_path, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("Usage: ") and "Commands:" in result.stdout
        assert "train" in result.stdout and "Examples:" in result.stdout
