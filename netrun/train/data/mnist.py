"""Sources `mnist` and `fashion-mnist`: the four IDX files, with the `mnist-10k` split.

`split: standard` trains on the train files and tests on the t10k files. `split: mnist-10k`
uses the t10k files only (train on the first 8,000, test on the last 2,000): it is what a
machine that only has the test split can train on, and it never downloads the train files.
Images come out as raw 0..255 float32 N x 1 x 28 x 28 (scaling is a transform), labels int32.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from netrun.errors import ConfigError, NetrunError, suggest
from netrun.train.data import download
from netrun.train.data.base import Arrays, DataSource, SourceRequest, register_source
from netrun.train.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx
from netrun.train.data.paths import resolve_data_dir

FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "t10k": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
SPLITS = ("standard", "mnist-10k")
SPLIT_10K_TRAIN = 8000          # mnist-10k: t10k[:8000] for training, t10k[8000:] for testing


class MnistSource(DataSource):
    """MNIST or Fashion-MNIST from IDX files (gzip or raw) in one folder."""

    input_shape = (1, 28, 28)
    num_classes = 10

    def __init__(self, name: str, directory: Path, split: str = "standard",
                 download: bool = True, origin: str = "given by --data-dir or data.dir"):
        super().__init__()
        if split not in SPLITS:
            raise ConfigError(f"data.split: unknown split '{split}' for {name} (one of "
                              f"{', '.join(SPLITS)}){suggest(split, SPLITS)}")
        self.name, self.directory, self.split = name, Path(directory), split
        self.download, self.origin = download, origin
        self._groups: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def describe(self) -> str:
        """One line for logs."""
        return f"{self.name} ({self.split} split) from {self.directory}"

    def _load(self, part: str) -> Arrays:
        if self.split == "mnist-10k":
            images, labels = self._read("t10k")
            if len(labels) != 10000:
                raise NetrunError(f"{self.directory}: the mnist-10k split needs the 10,000 "
                                  f"t10k examples, the files hold {len(labels)}")
            cut = slice(0, SPLIT_10K_TRAIN) if part == "train" else slice(SPLIT_10K_TRAIN, None)
            return Arrays(images[cut], labels[cut])
        return Arrays(*self._read("train" if part == "train" else "t10k"))

    def _read(self, group: str) -> tuple[np.ndarray, np.ndarray]:
        if group not in self._groups:      # mnist-10k reads t10k once for both parts
            self._groups[group] = self._read_files(group)
        return self._groups[group]

    def _read_files(self, group: str) -> tuple[np.ndarray, np.ndarray]:
        paths = self._locate(group)
        images = read_idx(paths[0], IMAGES_MAGIC)
        labels = read_idx(paths[1], LABELS_MAGIC)
        if len(images) != len(labels):
            raise NetrunError(f"{paths[0]} holds {len(images)} images but {paths[1]} holds "
                              f"{len(labels)} labels")
        if labels.size and labels.max() >= self.num_classes:
            raise NetrunError(f"{paths[1]}: label {int(labels.max())} is not a class 0-9")
        return images.astype(np.float32)[:, None], labels.astype(np.int32)  # (N, 1, 28, 28)

    def _locate(self, group: str) -> list[Path]:
        """The group's two files (gzip or already unpacked), downloading them if allowed."""
        found = [_existing(self.directory, name) for name in FILES[group]]
        missing = [name for name, path in zip(FILES[group], found) if path is None]
        if not missing:
            return found  # type: ignore[return-value]
        problem = "downloading is off (download: false)"
        if self.download:
            try:
                download.download_files(self.name, missing, self.directory)
                return [_existing(self.directory, name) for name in FILES[group]]  # type: ignore
            except download.DownloadError as e:
                problem = str(e)
        raise NetrunError(self._missing_message(group, missing, problem))

    def _missing_message(self, group: str, missing: list[str], problem: str) -> str:
        what = {"train": "training", "t10k": "test (t10k)"}[group]
        text = (f"{self.name}: {what} files missing from {self.directory} ({self.origin}): "
                f"{', '.join(missing)}; {problem}. To fix: put the files in "
                f"that folder, point NETRUN_DATA at a folder that holds {self.name}/, or pass "
                f"--data-dir (data.dir in the config).")
        have_t10k = all(_existing(self.directory, n) for n in FILES["t10k"])
        if group == "train" and have_t10k:
            spec = " (data spec mnist-10k:train)" if self.name == "mnist" else ""
            text += (f" Only the t10k files are there: `split: mnist-10k`{spec} trains on "
                     "t10k[:8000] and tests on t10k[8000:].")
        return text


def _existing(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / name.removesuffix(".gz")):
        if candidate.is_file():
            return candidate
    return None


@register_source("mnist", "fashion-mnist", "mnist-10k")
def make_mnist(request: SourceRequest) -> MnistSource:
    """`mnist`, `fashion-mnist`, or `mnist-10k` (mnist with the 10k split)."""
    cfg, name = request.cfg, request.name
    split = cfg.get("split")
    if name == "mnist-10k":
        if split not in (None, "mnist-10k"):
            raise ConfigError(f"data: source mnist-10k already names the split; "
                              f"split: {split} contradicts it")
        name, split = "mnist", "mnist-10k"
    directory, origin = resolve_data_dir(name, request.data_dir, request.config_dir)
    return MnistSource(name, directory, str(split or "standard"),
                       download=bool(cfg.get("download", True)), origin=origin)
