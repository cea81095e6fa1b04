"""`netrun data build|mean|describe`: image databases as Caffe's convert_imageset and
compute_image_mean make them, and a look inside one. The work is in netrun.tools; this is
options, progress and output."""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import click

from netrun.cli.console import console

_JSON = click.option("--json", "as_json", is_flag=True,
                     help="Print the result as JSON on stdout (for scripts).")
_BACKEND = click.option("--backend", type=click.Choice(["lmdb", "leveldb"]), default=None,
                        help="The database's kind (default: found from its files).")


@click.group("data", short_help="Image databases: build, mean image, describe.")
def data() -> None:
    """Image databases (LMDB, LevelDB) of Caffe Datum records: build one from image files,
    compute its mean image, describe what it holds.

    \b
    Examples:
      netrun data build photos/ train_lmdb --resize 32x32 --shuffle --seed 1
      netrun data mean train_lmdb -o mean.binaryproto
      netrun data describe train_lmdb
    """


@data.command("build", short_help="Write image files to a new LMDB/LevelDB (convert_imageset).")
@click.argument("source", metavar="INPUT", type=click.Path())
@click.argument("out", metavar="OUT", type=click.Path())
@click.option("--root", default="", metavar="FOLDER",
              help="With a list file: the folder its image paths are under (convert_imageset's "
                   "root folder).")
@click.option("--resize", metavar="HxW",
              help="Resize every image to H rows by W columns (bilinear), e.g. 256x256.")
@click.option("--resize-height", type=click.IntRange(0), default=0,
              help="Height to resize to (with --resize-width; 0 keeps the size).")
@click.option("--resize-width", type=click.IntRange(0), default=0,
              help="Width to resize to (with --resize-height; 0 keeps the size).")
@click.option("--gray", is_flag=True, help="Store one gray channel instead of three (BGR).")
@click.option("--shuffle", is_flag=True, help="Write the images in a random order.")
@click.option("--seed", type=click.IntRange(0),
              help="Seed for --shuffle; the same seed gives the same order (default: a random "
                   "seed, printed so the order can be repeated).")
@click.option("--encoded", is_flag=True,
              help="Store image files (PNG/JPEG bytes) instead of raw pixels: each file's own "
                   "bytes when no resize or gray conversion changes it, else re-encoded.")
@click.option("--encode-type", type=click.Choice(["png", "jpg", "jpeg"], case_sensitive=False),
              help="Format of encoded records (implies --encoded; default: each file's own).")
@click.option("--quality", type=click.IntRange(1, 100), default=95, show_default=True,
              help="JPEG quality when records are encoded as JPEG.")
@click.option("--backend", type=click.Choice(["lmdb", "leveldb"]), default="lmdb",
              show_default=True, help="The kind of database to write.")
@click.option("--check-size", is_flag=True,
              help="Fail unless all images have one size (after any resize).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@_JSON
def build(source, out, root, resize, resize_height, resize_width, gray, shuffle, seed, encoded,
          encode_type, quality, backend, check_size, overwrite, as_json) -> None:
    """Write the images of INPUT to a new database OUT, as Caffe's convert_imageset.

    INPUT is a folder with one subfolder per class (labels are the class names' sorted
    order; the names go to OUT/classes.txt) or a Caffe list file of "path label" lines.
    Images that cannot be read are skipped with a warning.

    \b
    Examples:
      netrun data build photos/ train_lmdb --resize 32x32 --shuffle --seed 1
      netrun data build train.txt train_lmdb --root images/ --encoded --encode-type jpg
    """
    from netrun.tools.imageset import build_database  # lazy: loaded when the command runs

    if seed is not None and not shuffle:
        raise click.UsageError("--seed sets the order of --shuffle: add --shuffle")
    size = _resize(resize, resize_height, resize_width)
    with _progress("build", as_json) as on_progress:
        summary = build_database(
            source, out, root=root, resize=size, gray=gray, shuffle=shuffle, seed=seed,
            encoded=encoded, encode_type=encode_type, quality=quality, backend=backend,
            check_size=check_size, overwrite=overwrite, on_progress=on_progress,
            on_skip=lambda path, reason: console.warn(f"skipped {path}: {reason}"))
    if as_json:
        console.json(summary)
        return
    _build_summary(summary)


@data.command("mean", short_help="The mean image of a database (compute_image_mean).")
@click.argument("database", metavar="DB", type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the mean image: .binaryproto (Caffe's BlobProto, 1 x C x H x W, "
                   "float32) or .npy (C x H x W, float32).")
@_BACKEND
@_JSON
def mean(database, output, backend, as_json) -> None:
    """The mean image over all records of the database DB, as Caffe's compute_image_mean.

    DB is an LMDB or LevelDB folder of Datum records of one size (raw, encoded or
    float); image folders and list files are not read here: build a database first. The
    per-channel means are printed as compute_image_mean logs them (Caffe's mean_value).

    \b
    Example:
      netrun data mean train_lmdb -o mean.binaryproto
    """
    from netrun.tools.image_mean import (  # lazy: loaded when the command runs
        compute_mean,
        mean_format,
        write_mean,
    )

    fmt = mean_format(output) if output else None   # a bad name fails before the long read
    with _progress("mean", as_json) as on_progress:
        result = compute_mean(database, backend, on_progress)
    if output:
        write_mean(result["mean"], output)
        console.info(f"wrote the mean of {result['records']:,} records "
                     f"({_shape(result['shape'])}) to {output} ({fmt})")
    channels = result["channel_means"]
    if as_json:
        console.json({"path": database, "records": result["records"], "shape": result["shape"],
                      "channel_means": channels, "output": output, "format": fmt})
        return
    console.line(f"Number of channels: {len(channels)}")
    for c, value in enumerate(channels):
        console.line(f"mean_value channel [{c}]: {value:.6g}")


@data.command("describe", short_help="What a database holds: records, shapes, labels.")
@click.argument("database", metavar="DB", type=click.Path())
@click.option("--grid", type=click.Path(dir_okay=False),
              help="Write the first --samples images as one picture (.png), in rows of "
                   "sqrt(N), each cell padded to the largest image.")
@click.option("--samples", type=click.IntRange(1), default=64, show_default=True,
              help="How many images --grid shows.")
@_BACKEND
@_JSON
def describe(database, grid, samples, backend, as_json) -> None:
    """What the database DB holds: its backend, record count, how records are stored (raw
    pixels, encoded files, floats), the shapes seen and a histogram of labels.

    \b
    Examples:
      netrun data describe train_lmdb
      netrun data describe train_lmdb --grid samples.png --samples 16 --json
    """
    from netrun.tools.db_describe import (  # lazy: loaded when the command runs
        describe_database,
        grid_format,
        write_grid,
    )

    if grid:
        grid_format(grid)   # a bad name fails before the long read
    with _progress("describe", as_json) as on_progress:
        info = describe_database(database, backend, samples if grid else 0, on_progress)
    if grid:
        images = info.pop("samples")
        height, width = write_grid(images, grid)
        console.info(f"wrote {len(images)} sample images as a {width}x{height} grid to {grid}")
        info["grid"] = {"path": grid, "samples": len(images), "width": width, "height": height}
    if as_json:
        console.json(info)
        return
    _describe_text(info)


def _build_summary(s: dict) -> None:
    shapes = ", ".join(f"{_shape(x['shape'])} x{x['count']:,}" for x in s["shapes"])
    labels = (f"{len(s['classes'])} classes (names in {s['output']}/classes.txt)"
              if s["classes"] is not None else f"{len(s['labels'])} distinct labels")
    kind = "encoded" if s["encoded"] else "raw"
    console.info(f"wrote {s['records']:,} {kind} records to {s['output']} ({s['backend']}): "
                 f"{shapes}; {labels}; {_size(s['disk_bytes'])} on disk; {s['seconds']:.1f} s")
    if s["seed"] is not None:
        console.info(f"shuffled with seed {s['seed']} (--seed {s['seed']} repeats the order)")
    if s["skipped"]:
        n = len(s["skipped"])
        console.warn(f"skipped {n} image{'s' if n != 1 else ''} that could not be read")


def _describe_text(info: dict) -> None:
    kinds = ", ".join(f"{n:,} {k}" for k, n in info["kinds"].items() if n)
    formats = ", ".join(f"{n:,} {f}" for f, n in info["formats"].items())
    console.line(f"{info['path']}: {info['backend']}, {info['records']:,} records "
                 f"({kinds or 'none'}{'; ' + formats if formats else ''}), "
                 f"{_size(info['record_bytes'])} of records")
    if info["shapes"]:
        console.table(["shape (CxHxW)", "records"],
                      ([_shape(x["shape"]), f"{x['count']:,}"] for x in info["shapes"]),
                      right=("records",))
    if info["labels"]:
        total = max(info["records"], 1)
        rows = ([x["label"], x["name"] or "", f"{x['count']:,}", f"{x['count'] / total:.1%}"]
                for x in info["labels"])
        console.table(["label", "class", "records", "share"], rows,
                      right=("label", "records", "share"))


def _resize(text: str | None, height: int, width: int) -> tuple[int, int]:
    """(height, width) from --resize HxW or --resize-height/--resize-width."""
    if text is not None:
        if height or width:
            raise click.UsageError("give --resize HxW or --resize-height/--resize-width, "
                                   "not both")
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
        if not match or not int(match[1]) or not int(match[2]):
            raise click.BadParameter(f"'{text}': expected HEIGHTxWIDTH, e.g. 256x256",
                                     param_hint="--resize")
        return int(match[1]), int(match[2])
    if bool(height) != bool(width):
        raise click.UsageError("--resize-height and --resize-width go together (or use "
                               "--resize HxW)")
    return height, width


@contextlib.contextmanager
def _progress(label: str, as_json: bool) -> Iterator:
    """An on_progress(done, total) callback drawing a bar on an interactive stderr; None when
    stderr is not a terminal, with -q or with --json."""
    if as_json or not console.interactive or console.verbosity < 0:
        yield None
        return
    from rich.progress import (  # lazy: loaded when the command runs
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console.err, transient=True) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape)


def _size(count: float) -> str:
    if count < 1024:
        return f"{int(count):,} bytes"
    for unit in ("KiB", "MiB"):
        count /= 1024
        if count < 1024:
            return f"{count:.1f} {unit}"
    return f"{count / 1024:.1f} GiB"


__all__ = ["data"]
