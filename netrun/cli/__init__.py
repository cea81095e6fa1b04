"""The `netrun` command: a click group whose commands live one per module and load lazily.

Every NetrunError (bad input) becomes one paragraph on stderr and exit status 2; any other
exception is a bug in netrun, reported as an internal error with exit status 1 and a request
to report it. `--debug` (or NETRUN_DEBUG=1) adds the traceback. Commands import their own
modules (training, inference, profiling) inside their function bodies, when they run.

Exit statuses: 0 done, 1 internal error, 2 bad input, 128 + N stopped by signal N (130
SIGINT, 143 SIGTERM, 129 SIGHUP; 141, as for SIGPIPE, when a reader closed stdout before a
command's output was complete; `train` keeps training then, with its output dropped).
"""
from __future__ import annotations

import importlib
import signal
import sys
import traceback

import click

from netrun.cli.console import abort, console
from netrun.errors import NetrunError, suggest
from netrun.version import __version__

# command name -> "module:function"; adding a command is one line here.
COMMANDS = {
    "ops": "netrun.cli.ops_cmd:ops",
    "inspect": "netrun.cli.inspect_cmd:inspect",
    "convert": "netrun.cli.convert_cmd:convert",
    "train": "netrun.cli.train_cmd:train",
    "infer": "netrun.cli.infer_cmd:infer",
    "profile": "netrun.cli.profile_cmd:profile",
    "algos": "netrun.cli.algos_cmd:algos",
    "data": "netrun.cli.data_cmd:data",
    "export": "netrun.cli.export_cmd:export",
    "draw": "netrun.cli.draw_cmd:draw",
    "plot": "netrun.cli.plot_cmd:plot",
}


class NetrunGroup(click.Group):
    """Loads commands from COMMANDS on demand and turns NetrunError into exit status 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS:
            ctx.fail(f"no such command '{name}'{suggest(name, COMMANDS)}")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context):
        from netrun.train.dist import abort_on_error, launched_size

        if launched_size() == 1:
            return self._invoke(ctx)
        # One rank of a data-parallel job: an error that ends this rank ends them all (the
        # others would wait for it in their next exchange).
        from netrun.train.dist import world

        with abort_on_error(world()):
            return self._invoke(ctx)

    def _invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except NetrunError as e:
            if console.debug:
                traceback.print_exc()
            abort(str(e))
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            # The reader is gone (`| head`): not an error to report, and nothing to report to.
            console.stdout.silence()
            console.stderr.silence()
            raise click.exceptions.Exit(128 + getattr(signal, "SIGPIPE", 13)) from None
        except OSError as e:   # the machine's, not netrun's: a full disk, a permission
            if console.debug:
                traceback.print_exc()
            where = f"{e.filename}: " if e.filename else ""
            abort(f"{where}{e.strerror or e}")
        except Exception as e:
            if console.debug:
                traceback.print_exc()
            abort(f"internal error: {type(e).__name__}: {e}\nThis is a bug in netrun, not a "
                  f"problem with your input: please report it with the output of "
                  f"`netrun --debug {' '.join(sys.argv[1:])}`.", code=1)


def _version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """--version: the version, then the engines found (NumPy's BLAS, Numba, oneDNN, CuPy, MPI)."""
    if not value or ctx.resilient_parsing:
        return
    from netrun.cli.version_info import describe

    click.echo(f"netrun, version {__version__}")
    for name, found in describe():
        click.echo(f"  {name}: {found}")
    ctx.exit()


@click.group(cls=NetrunGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Exit status: 0 done, 1 a bug in netrun, 2 bad input (a file, an option), "
                    "128+N stopped by signal N.")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and the engines found (BLAS, Numba, oneDNN, CuPy, MPI).")
@click.option("--debug", is_flag=True, envvar="NETRUN_DEBUG",
              help="Show tracebacks for errors. [env: NETRUN_DEBUG]")
@click.option("-v", "--verbose", count=True, help="More detail on stderr (repeatable).")
@click.option("-q", "--quiet", count=True, help="Less detail on stderr (repeatable).")
@click.option("--color/--no-color", default=None,
              help="Force colour on or off (default: on for terminals, off with NO_COLOR).")
def cli(debug: bool, verbose: int, quiet: int, color: bool | None) -> None:
    """netrun: run deep-learning models written as layer YAML or Caffe2/Caffe nets.

    Train a model from a config, predict with its checkpoint, look inside a net (shapes,
    parameters, FLOPs), time its operators, draw it, export it to ONNX. `netrun COMMAND
    --help` explains a command's options, with examples.

    \b
    Examples:
      netrun train configs/quickstart.yaml          # LeNet on generated digits, on the CPU
      netrun infer runs/quickstart/best.h5 generated:test
      netrun inspect zoo/lenet.yaml --batch 64
      netrun profile zoo/lenet.yaml --batch 64
      netrun ops Conv
    """
    from netrun.train.dist import launched_rank

    # In a data-parallel job rank 0 speaks for all; the others say only what goes wrong.
    quiet += 1 if launched_rank() != 0 else 0
    console.configure(color=color, verbosity=verbose - quiet, debug=debug)
    # Silent waits below (rendering data, compiling kernels, downloads) get a spinner on a
    # terminal for as long as the command runs (netrun.util.progress).
    click.get_current_context().with_resource(console.waits())


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="netrun")


__all__ = ["cli", "main", "COMMANDS"]
