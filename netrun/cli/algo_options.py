"""The --algo-search and --workspace-limit options shared by train and profile."""
from __future__ import annotations

import click

MODES = ("heuristic", "exhaustive", "deterministic")


def algo_options(fn):
    """Decorate a command with --algo-search and --workspace-limit."""
    fn = click.option("--workspace-limit", metavar="BYTES",
                      help="Largest scratch an algorithm may use, e.g. 512M (default: none).")(fn)
    fn = click.option("--algo-search", type=click.Choice(MODES),
                      help="How convolutions pick algorithms: rules (heuristic), timing every "
                           "applicable one once and caching the winner on disk (exhaustive), "
                           "or deterministic ones only. Default: the config's, else heuristic.")(fn)
    return fn


def configure_algos(ws, mode: str | None, workspace_limit: str | None) -> None:
    """Apply the options to a workspace (nothing to do when both are unset)."""
    if mode is None and workspace_limit is None:
        return
    from netrun.conv import configure, parse_bytes  # lazy: loaded when the command runs

    configure(ws, mode=mode or "heuristic",
              workspace_limit=parse_bytes(workspace_limit) if workspace_limit else None)
