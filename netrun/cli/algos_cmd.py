"""`netrun algos list|clear`: the convolution algorithm cache written by exhaustive search."""
from __future__ import annotations

from typing import Any

import click

from netrun.cli.console import console

_CACHE_DIR = click.option(
    "--cache-dir", type=click.Path(file_okay=False), envvar="NETRUN_CACHE_DIR", default=None,
    help="Cache folder. [env: NETRUN_CACHE_DIR; default: ~/.cache/netrun/algos]")


@click.group("algos", short_help="The convolution algorithm cache (list, clear).")
def algos() -> None:
    """The convolution algorithm cache: which algorithm won for each problem, and timings.

    `netrun train` and `netrun profile` with --algo-search exhaustive time every applicable
    convolution algorithm once per problem and keep the fastest here, so later runs start
    with it.

    \b
    Examples:
      netrun algos list
      netrun algos list --json
      netrun algos clear --yes
    """


@algos.command("list", short_help="Show the cached problems and the known algorithms.")
@_CACHE_DIR
@click.option("--json", "as_json", is_flag=True, help="Print entries and algorithms as JSON.")
def list_(cache_dir: str | None, as_json: bool) -> None:
    """Show every cached problem with its fastest algorithm, and the known algorithms.

    \b
    Examples:
      netrun algos list
      netrun algos list --cache-dir /tmp/algos --json
    """
    from netrun.conv import cache  # lazy: loaded when the command runs

    folder = cache_dir or str(cache.default_cache_dir())
    files = [_file(path) for path in cache.list_files(folder)]
    if as_json:
        console.json({"cache_dir": folder, "files": files, "algorithms": _algorithms()})
        return
    rows = [[e["direction"], e["problem"], e["best"], f"{e['times_ms'][e['best']]:.3f}",
             ", ".join(f"{n} {t:.3f}" for n, t in sorted(e["times_ms"].items(),
                                                         key=lambda r: r[1])[1:]),
             f["device"]]
            for f in files for e in f["entries"]]
    if rows:
        console.table(["direction", "problem", "fastest", "ms", "others (ms)", "device"], rows,
                      right=("ms",))
    count = sum(len(f["entries"]) for f in files)
    console.info(f"{count} cached problem{'s' if count != 1 else ''} in {len(files)} "
                 f"file{'s' if len(files) != 1 else ''} under {folder}")
    console.table(["algorithm", "deterministic", "what"],
                  ([a["name"], "yes" if a["deterministic"] else "no", a["summary"]]
                   for a in _algorithms()))


@algos.command("clear", short_help="Delete the cache files.")
@_CACHE_DIR
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def clear(cache_dir: str | None, yes: bool) -> None:
    """Delete the cache files (the next exhaustive run searches again).

    \b
    Examples:
      netrun algos clear
      netrun algos clear --yes      # without asking
    """
    from netrun.conv import cache  # lazy: loaded when the command runs

    folder = cache_dir or str(cache.default_cache_dir())
    files = cache.list_files(folder)
    if not files:
        console.info(f"no algorithm cache under {folder}")
        return
    if not yes:
        click.confirm(f"delete {len(files)} algorithm cache file(s) under {folder}?", abort=True,
                      err=True)
    removed = cache.clear(folder)
    console.info(f"removed {len(removed)} file{'s' if len(removed) != 1 else ''} under {folder}")


def _file(path) -> dict[str, Any]:
    from netrun.conv import cache  # lazy: loaded when the command runs

    header, entries = cache.read_file(path)
    out = []
    for key, entry in sorted(entries.items()):
        fields = key.split("|")
        env = dict(f.split("=", 1) for f in fields if "=" in f)
        problem = " ".join(f for f in fields[1:] if "=" not in f)
        best = min(entry.times_ms, key=entry.times_ms.get) if entry.times_ms else ""
        out.append({"key": key, "direction": fields[0], "problem": problem, "env": env,
                    "best": best, "times_ms": entry.times_ms, "skipped": entry.skipped,
                    "workspace_limit": entry.limit})
    return {"path": str(path), "backend": header.get("backend") or "",
            "device": header.get("device") or "", "entries": out}


def _algorithms() -> list[dict[str, Any]]:
    from netrun.conv.algorithm import algorithms  # lazy: loaded when the command runs

    return [{"name": a.name, "backend": backend, "deterministic": a.deterministic,
             "summary": a.summary}
            for backend in ("cpu", "gpu") for a in algorithms(backend).values()]
