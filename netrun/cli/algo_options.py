"""The --algo-search and --workspace-limit options shared by train and profile."""
from __future__ import annotations

import click

MODES = ("heuristic", "exhaustive", "deterministic")


def algo_options(fn):
    """Decorate a command with --algo-search, --workspace-limit and --tf32."""
    fn = click.option("--tf32", is_flag=True, default=None,
                      help="Let float32 convolutions on the GPU use TF32 tensor cores "
                           "(cuDNN): faster, products rounded to a 10-bit mantissa. "
                           "Default: the config's tf32, else off.")(fn)
    fn = click.option("--workspace-limit", metavar="BYTES",
                      help="Largest scratch an algorithm may use, e.g. 512M (default: none).")(fn)
    fn = click.option("--algo-search", type=click.Choice(MODES),
                      help="How convolutions pick algorithms: rules (heuristic), timing every "
                           "applicable one once and caching the winner on disk (exhaustive), "
                           "or deterministic ones only. Default: the config's, else heuristic.")(fn)
    return fn


def configure_algos(ws, mode: str | None, workspace_limit: str | None,
                    tf32: bool | None = None) -> None:
    """Apply the options to a workspace (nothing to do when all are unset)."""
    if mode is None and workspace_limit is None and not tf32:
        return
    from netrun.conv import configure, parse_bytes  # lazy: loaded when the command runs

    # An option not given keeps the workspace's setting (the default 1 GiB scratch limit too).
    configure(ws, mode=mode,
              workspace_limit=parse_bytes(workspace_limit) if workspace_limit else "keep",
              tf32=tf32 or None)
