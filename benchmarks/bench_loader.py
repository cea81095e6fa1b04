"""Does netrun's image loader keep up with training? Images per second decoded and augmented,
against the training steps of ResNet-20 and ResNet-50 (issue 16).

    python benchmarks/bench_loader.py [--threads 2] [--only png,jpeg,loader,train]
                                      [--quick] [--json] [--steps K] [--batch N]
                                      [--workers 0,1,2] [--seconds S]
    python benchmarks/bench_loader.py --show RESULT.json     (the tables of a --json run)

The datasets are made in a temporary folder and removed afterwards: 32×32 PNGs in class
subfolders (a `folder` source, the size of CIFAR's PNGs), and 256×256 JPEGs (simplejpeg,
quality 90; smooth random content with some grain, about 25 KB a file as photos of that size
are) both as a `folder` source and as an LMDB of encoded Datums written by
`netrun.tools.imageset.build_database` (convert_imageset), the `db` source. No network.

Loader: `BatchLoader` over each source with the training transform (PNG: mirror and scale;
JPEG: random 224 crop, mirror, per-channel mean), at the training batch (128 for PNG, 8 for
JPEG), in the caller (no prefetch), with a prefetch thread (workers 0) and with 1 and 2
worker processes. The first batch's wait is the start-up (spawning the workers included);
the batches already made ahead are taken next, untimed; then images per second over at least
`--seconds` with nothing else running in the consumer.

Training: the Trainer of `netrun train` (a config dict, the zoo nets) runs ResNet-20 at batch
128 on the PNG folder and ResNet-50 at batch 8 on the JPEG folder and LMDB, with each number
of data workers, and once with a loader stand-in that hands out one batch made in advance
(the net alone, no data work at all). Each step is timed around `Trainer.step`, and the wait
inside `loader.next()` (the hand-over copy included) is timed by wrapping the loader; the
first steps are not counted (the net's first run and the loader's start and backlog).
Medians and totals over `--steps` steps; the wait fraction is total wait / total step time.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NETS = {"resnet20": "zoo/resnet20.yaml", "resnet50": "zoo/resnet50.yaml"}
TITLES = {"resnet20": "ResNet-20", "resnet50": "ResNet-50"}
DATASETS = ("png", "jpeg")
PARTS = ("loader", "train")
CLASSES = 10
PNG_SIZE, JPEG_SIZE, CROP = 32, 256, 224
JPEG_QUALITY = 90
# Caffe's ImageNet mean (BGR) and CIFAR's 1/256 scale: the usual transforms of both kinds.
JPEG_TRANSFORM = {"crop_size": CROP, "mirror": True, "mean_value": [104.0, 117.0, 123.0]}
PNG_TRANSFORM = {"mirror": True, "scale": 0.00390625}
# dataset -> the net it feeds and its training batch (issue 16's pairs).
TRAINS = {"png": ("resnet20", 128), "jpeg": ("resnet50", 8)}
# BatchLoader's default depth: batches queued ahead of the consumer (workers add theirs).
LOADER_DEPTH = 3
IMAGES = {"png": 2560, "jpeg": 1024}
QUICK_IMAGES = {"png": 128, "jpeg": 16}


# Datasets -------------------------------------------------------------------------------------
def smooth_image(rng: np.random.Generator, size: int, texture: float) -> np.ndarray:
    """A uint8 3 x size x size picture: noise at three scales, a colour gradient, grain.

    Pure noise would make JPEGs several times larger than photos' and flat colour far
    smaller; this mix gives about 25 KB at 256×256, quality 90, and PNGs of CIFAR's size."""
    from netrun.train.data.images import resize_image

    out = np.zeros((3, size, size), np.float32)
    for cells, amplitude in ((4, 60.0), (16, 30.0), (64, 14.0)):
        noise = rng.integers(0, 256, (3, cells, cells), dtype=np.uint8)
        out += (resize_image(noise, size, size).astype(np.float32) - 128) * (amplitude / 128)
    y, x = np.mgrid[0:size, 0:size] / size
    slope = rng.uniform(-1, 1, (3, 2))
    out += 60 * (slope[:, 0, None, None] * y + slope[:, 1, None, None] * x)
    out += rng.normal(0, texture, out.shape)
    return np.clip(out + 128, 0, 255).astype(np.uint8)


def write_folder(root: Path, count: int, size: int, fmt: str, seed: int) -> dict:
    """`count` images in CLASSES subfolders of `root`; their sizes in bytes."""
    from netrun.train.data.images import encode_image

    rng = np.random.default_rng(seed)
    suffix = "jpg" if fmt == "jpg" else "png"
    sizes = []
    for c in range(CLASSES):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        data = encode_image(smooth_image(rng, size, 5.0), fmt, quality=JPEG_QUALITY)
        (root / f"class{i % CLASSES}" / f"{i:06d}.{suffix}").write_bytes(data)
        sizes.append(len(data))
    return {"images": count, "size": [size, size], "format": fmt,
            "mean_file_bytes": float(np.mean(sizes)), "folder_bytes": int(np.sum(sizes))}


def make_datasets(tmp: Path, datasets: list[str], quick: bool, log) -> dict:
    """Write the selected datasets under `tmp`; what was made, with paths and sizes."""
    from netrun.tools.imageset import build_database

    counts = QUICK_IMAGES if quick else IMAGES
    made = {}
    if "png" in datasets:
        log(f"writing {counts['png']} {PNG_SIZE}×{PNG_SIZE} PNGs...")
        t0 = time.perf_counter()
        made["png"] = write_folder(tmp / "png", counts["png"], PNG_SIZE, "png", seed=1)
        made["png"].update(folder=str(tmp / "png"), seconds=time.perf_counter() - t0)
    if "jpeg" in datasets:
        log(f"writing {counts['jpeg']} {JPEG_SIZE}×{JPEG_SIZE} JPEGs and their LMDB...")
        t0 = time.perf_counter()
        made["jpeg"] = write_folder(tmp / "jpeg", counts["jpeg"], JPEG_SIZE, "jpg", seed=2)
        made["jpeg"].update(folder=str(tmp / "jpeg"), seconds=time.perf_counter() - t0,
                            quality=JPEG_QUALITY)
        # Encoded records keep each file's own bytes (no second JPEG pass), shuffled as
        # convert_imageset --shuffle writes them, since the db source reads in key order.
        summary = build_database(tmp / "jpeg", tmp / "jpeg_lmdb", encoded=True, shuffle=True,
                                 seed=3)
        made["jpeg"].update(lmdb=str(tmp / "jpeg_lmdb"), lmdb_bytes=summary["disk_bytes"],
                            lmdb_seconds=summary["seconds"])
    return made


def sources(made: dict) -> list[tuple[str, str, dict, dict]]:
    """(dataset, kind, data config, transform config) of each source to measure."""
    out = []
    if "png" in made:
        out.append(("png", "folder", {"source": "folder", "train": made["png"]["folder"]},
                    PNG_TRANSFORM))
    if "jpeg" in made:
        out.append(("jpeg", "folder", {"source": "folder", "train": made["jpeg"]["folder"]},
                    JPEG_TRANSFORM))
        out.append(("jpeg", "lmdb", {"source": "db", "train": made["jpeg"]["lmdb"]},
                    JPEG_TRANSFORM))
    return out


def mode_name(workers: int | None) -> str:
    """How batches are made: in the caller, a prefetch thread, or worker processes."""
    if workers is None:
        return "in the caller"
    if workers == 0:
        return "thread"
    return f"{workers} worker{'s' if workers > 1 else ''}"


# Loader throughput ----------------------------------------------------------------------------
def loader_row(data_cfg: dict, transform_cfg: dict, batch: int, workers: int | None,
               seconds: float, min_batches: int) -> dict:
    """Images per second of a BatchLoader over one source, as the Trainer builds it."""
    from netrun.train.data import BatchLoader, make_source, make_transform

    source = make_source(data_cfg)
    arrays = tuple(source.train)
    loader = BatchLoader(arrays, batch, shuffle=source.shuffle, seed=1,
                         transform=make_transform(transform_cfg), reuse_buffers=True,
                         workers=workers or 0, prefetch=workers is not None)
    try:
        t0 = time.perf_counter()
        loader.next()
        startup = time.perf_counter() - t0
        # The batches made ahead during the start would inflate the rate: take them first.
        ahead = 0 if workers is None else LOADER_DEPTH + workers
        for _ in range(ahead):
            loader.next()
        intervals = []
        t0 = last = time.perf_counter()
        while len(intervals) < min_batches or last - t0 < seconds:
            loader.next()
            now = time.perf_counter()
            intervals.append(now - last)
            last = now
    finally:
        loader.close()
    elapsed = last - t0
    return {"batch": batch, "workers": workers, "mode": mode_name(workers),
            "startup_s": startup, "batches": len(intervals),
            "images": len(intervals) * batch, "seconds": elapsed,
            "images_per_s": len(intervals) * batch / elapsed,
            "batch_ms": 1e3 * elapsed / len(intervals),
            "batch_ms_median": 1e3 * statistics.median(intervals)}


# Training steps -------------------------------------------------------------------------------
class TimedLoader:
    """The trainer's loader, recording how long each next() kept the caller waiting."""

    def __init__(self, loader):
        self.loader, self.waits = loader, []

    def next(self):
        """The wrapped loader's next batch."""
        t0 = time.perf_counter()
        batch = self.loader.next()
        self.waits.append(time.perf_counter() - t0)
        return batch

    def __getattr__(self, name):
        return getattr(self.loader, name)


class ReadyBatch:
    """A loader stand-in that hands out one batch made in advance: the net alone."""

    def __init__(self, batch):
        self.batch = batch

    def next(self):
        """The same batch again."""
        return self.batch

    def close(self) -> None:
        """Nothing runs in the background."""


def train_config(net: str, batch: int, data_cfg: dict, transform_cfg: dict, workers: int,
                 output: Path):
    """A validated TrainConfig for `net` on one source, as a train YAML would give it."""
    from netrun.train.config import config_from_dict

    raw = {"model": str(REPO / NETS[net]), "output": str(output),
           "data": {**data_cfg, "batch_size": batch, "transform": dict(transform_cfg),
                    "workers": workers},
           # The loss does not matter here, only that it stays finite over a few steps.
           "solver": {"type": "sgd", "base_lr": 0.001, "momentum": 0.9, "weight_decay": 1e-4,
                      "max_iter": 1000, "display": 0, "seed": 1}}
    return config_from_dict(raw)


def train_row(net: str, batch: int, data_cfg: dict, transform_cfg: dict,
              workers: int | None, steps: int, warmup: int, output: Path) -> dict:
    """Step times and loader waits of `steps` Trainer steps (workers None: the net alone)."""
    from netrun.train.trainer import Trainer

    trainer = Trainer(train_config(net, batch, data_cfg, transform_cfg, workers or 0, output))
    try:
        trainer.start()
        if workers is None:
            made = trainer.loader.next()
            trainer.loader.close()
            trainer.loader = ReadyBatch(tuple(np.array(a) for a in made))
        timed = TimedLoader(trainer.loader)
        trainer.loader = timed
        step_s = []
        for _ in range(warmup + steps):
            t0 = time.perf_counter()
            trainer.step()
            step_s.append(time.perf_counter() - t0)
    finally:
        trainer.loader.close()
    startup, all_steps = timed.waits[0], step_s
    step_s, wait_s = step_s[warmup:], timed.waits[warmup:]
    del trainer
    gc.collect()
    return {"net": net, "batch": batch, "workers": workers,
            "mode": "net alone" if workers is None else mode_name(workers), "steps": steps,
            "warmup_steps": warmup, "startup_s": startup,
            "step_ms_median": 1e3 * statistics.median(step_s),
            "step_ms_total": 1e3 * sum(step_s),
            "wait_ms_median": 1e3 * statistics.median(wait_s),
            "wait_ms_total": 1e3 * sum(wait_s),
            "wait_fraction": sum(wait_s) / sum(step_s),
            "images_per_s": batch * steps / sum(step_s),
            # Every step, the first ones included: whether they had settled is for the reader
            # to see, not for the medians to hide.
            "all_step_ms": [1e3 * t for t in all_steps],
            "all_wait_ms": [1e3 * t for t in timed.waits]}


def compare(result: dict) -> None:
    """Add each row's ratios to the net alone: loader headroom, step slowdown."""
    alone = {(r["net"], r["batch"]): r for r in result["train"] if r["workers"] is None}
    for r in result["train"]:
        ref = alone.get((r["net"], r["batch"]))
        r["over_net_alone"] = r["step_ms_median"] / ref["step_ms_median"] if ref else None
    for r in result["loader"]:
        net, _ = TRAINS[r["dataset"]]
        ref = alone.get((net, r["batch"]))
        # What the net alone consumes, in images per second: above 1, the loader could keep
        # up if it had the cores to itself (in training it shares them with the net).
        r["net_alone_images_per_s"] = ref["images_per_s"] if ref else None
        r["over_net_need"] = r["images_per_s"] / ref["images_per_s"] if ref else None


# Output ---------------------------------------------------------------------------------------
def _ms(v) -> str:
    return "—" if v is None else (f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}")


def _ratio(v) -> str:
    return "—" if v is None else f"{v:.2f}"


def _source_name(dataset: str, kind: str) -> str:
    return f"{'PNG 32×32' if dataset == 'png' else 'JPEG 256×256'} {kind}"


def print_report(console, result: dict) -> None:
    """The datasets, the loader's throughput and the training steps, as rich tables."""
    from rich.table import Table

    data = Table(title="Datasets (made for this run)")
    for col in ("", "images", "mean file KB", "folder MB", "LMDB MB", "made in s"):
        data.add_column(col, justify="left" if not col else "right")
    for name, d in result["datasets"].items():
        lmdb = f"{d['lmdb_bytes'] / 1e6:.1f}" if "lmdb_bytes" in d else "—"
        made = d["seconds"] + d.get("lmdb_seconds", 0.0)
        data.add_row(f"{name.upper()} {d['size'][0]}×{d['size'][1]}", str(d["images"]),
                     f"{d['mean_file_bytes'] / 1e3:.1f}", f"{d['folder_bytes'] / 1e6:.1f}",
                     lmdb, f"{made:.1f}")
    console.print(data)

    if result["loader"]:
        table = Table(title=f"Loader: images decoded and augmented per second "
                            f"({result['cpus']} CPUs, nothing else in the consumer)")
        for col in ("source", "batch", "made by", "start-up s", "images/s", "ms/batch",
                    "net alone needs /s", "× need"):
            table.add_column(col, justify="left" if col in ("source", "made by") else "right")
        for r in result["loader"]:
            need = r["net_alone_images_per_s"]
            table.add_row(_source_name(r["dataset"], r["kind"]), str(r["batch"]), r["mode"],
                          f"{r['startup_s']:.2f}", f"{r['images_per_s']:.0f}",
                          _ms(r["batch_ms"]), "—" if need is None else f"{need:.0f}",
                          _ratio(r["over_net_need"]))
        console.print(table)

    if result["train"]:
        table = Table(title=f"Training steps (Trainer.step), {result['netrun_threads']} net "
                            f"threads; medians of {result['steps']} steps after "
                            f"the first ones")
        for col in ("net", "data", "made by", "step ms", "× net alone", "wait ms",
                    "wait ms total", "wait fraction", "start-up s"):
            table.add_column(col, justify="left" if col in ("net", "data", "made by")
                             else "right")
        for r in result["train"]:
            data_name = ("in memory" if r["workers"] is None
                         else _source_name(r["dataset"], r["kind"]))
            table.add_row(f"{TITLES[r['net']]} batch {r['batch']}", data_name,
                          "—" if r["workers"] is None else r["mode"],
                          _ms(r["step_ms_median"]), _ratio(r["over_net_alone"]),
                          _ms(r["wait_ms_median"]), _ms(r["wait_ms_total"]),
                          f"{r['wait_fraction']:.3f}", f"{r['startup_s']:.2f}")
        console.print(table)
    console.print(f"1-minute load average {result['load_average_before']:.2f} before, "
                  f"{result['load_average_after']:.2f} after, on {result['cpus']} CPUs.")


# Main -----------------------------------------------------------------------------------------
def selection(only: str) -> tuple[list[str], list[str], set[str]]:
    """The datasets and the parts (loader, train) that --only keeps, and its own words."""
    tokens = {t.strip() for t in only.split(",") if t.strip()} if only else set()
    unknown = tokens - set(DATASETS) - set(PARTS)
    if unknown:
        raise SystemExit(f"--only: unknown {', '.join(sorted(unknown))} (known: "
                         f"{', '.join((*DATASETS, *PARTS))})")
    datasets = [d for d in DATASETS if d in tokens] or list(DATASETS)
    parts = [p for p in PARTS if p in tokens] or list(PARTS)
    return datasets, parts, tokens


def worker_counts(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]."""
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"--workers: expected counts like 0,1,2, got {text!r}") from None
    if not counts or min(counts) < 0:
        raise SystemExit(f"--workers: expected counts of 0 or more, got {text!r}")
    return list(dict.fromkeys(counts))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2,
                        help="NETRUN_THREADS for the nets (default 2)")
    parser.add_argument("--only", default="",
                        help="comma-separated subset of png, jpeg, loader, train")
    parser.add_argument("--quick", action="store_true",
                        help="tiny datasets, short measurements; ResNet-50 trains only "
                             "with --only jpeg (then at batch 1, 1 step)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--steps", type=int, help="timed training steps per row (default 20)")
    parser.add_argument("--batch", type=int, help="one batch for every net and loader")
    parser.add_argument("--workers", default="0,1,2",
                        help="data worker counts to measure (0: a prefetch thread)")
    parser.add_argument("--seconds", type=float,
                        help="seconds of loader throughput per row (default 4)")
    parser.add_argument("--show", metavar="JSON", help="print the tables of a saved --json result")
    args = parser.parse_args(argv)
    from rich.console import Console

    if args.show:
        print_report(Console(width=None if sys.stdout.isatty() else 150),
                     json.loads(Path(args.show).read_text()))
        return 0
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.batch is not None and args.batch < 1:
        parser.error("--batch must be at least 1")
    datasets, parts, named = selection(args.only)
    workers = worker_counts(args.workers)
    steps = args.steps or (2 if args.quick else 20)
    if steps < 1:
        parser.error("--steps must be at least 1")
    seconds = args.seconds if args.seconds is not None else (0.3 if args.quick else 4.0)
    min_batches = 2 if args.quick else 5
    # Before netrun starts its workers (when the first net is bound).
    os.environ["NETRUN_THREADS"] = str(args.threads)

    from netrun.kernels.parallel import thread_count

    log = Console(stderr=True)
    result = {"threads": args.threads, "netrun_threads": thread_count(), "cpus": os.cpu_count(),
              "quick": args.quick, "steps": steps, "seconds": seconds, "workers": workers,
              "transforms": {"png": PNG_TRANSFORM, "jpeg": JPEG_TRANSFORM},
              "datasets": {}, "loader": [], "train": [],
              "load_average_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="netrun-bench-loader-") as tmp:
        made = make_datasets(Path(tmp), datasets, args.quick,
                             lambda m: log.print(f"[dim]{m}[/dim]"))
        result["datasets"] = made
        if "loader" in parts:
            for dataset, kind, data_cfg, transform_cfg in sources(made):
                batch = args.batch or TRAINS[dataset][1]
                for w in (None, *workers):
                    log.print(f"[dim]loader: {_source_name(dataset, kind)}, batch {batch}, "
                              f"{mode_name(w)}...[/dim]")
                    row = loader_row(data_cfg, transform_cfg, batch, w, seconds, min_batches)
                    result["loader"].append({"dataset": dataset, "kind": kind, **row})
        if "train" in parts:
            for dataset, kind, data_cfg, transform_cfg in sources(made):
                net, batch = TRAINS[dataset]
                batch, net_steps = args.batch or batch, steps
                if args.quick and net == "resnet50":
                    # Each ResNet-50 Trainer takes several seconds to build and bind even at
                    # batch 1, seven of them most of a minute: only when asked for by name.
                    if "jpeg" not in named:
                        continue
                    batch, net_steps = args.batch or 1, args.steps or 1
                done = {(r["net"], r["batch"]) for r in result["train"]
                        if r["workers"] is None}
                # The net alone once per net and batch, before the first source feeds it.
                modes = ([None] if (net, batch) not in done else []) + workers
                for w in modes:
                    warmup = 1 if args.quick else 2 + (0 if w is None else LOADER_DEPTH + w)
                    fed = ("one ready batch" if w is None else
                           f"{_source_name(dataset, kind)}, {mode_name(w)}")
                    log.print(f"[dim]training {TITLES[net]} batch {batch} on {fed}...[/dim]")
                    row = train_row(net, batch, data_cfg, transform_cfg, w, net_steps, warmup,
                                    Path(tmp) / "run")
                    result["train"].append({"dataset": dataset, "kind": kind, **row})
    compare(result)
    result["load_average_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        # Wide enough for the tables when the output goes to a file or a pipe.
        print_report(Console(width=None if sys.stdout.isatty() else 150), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
