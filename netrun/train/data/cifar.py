"""Source `cifar10`: CIFAR-10 in its binary form (no pickle): cifar-10-batches-bin/*.bin.

Each record is one label byte followed by 3,072 pixel bytes (the red, green and blue 32×32
planes). Images come out as raw 0..255 float32 N x 3 x 32 x 32, labels int32. When the
files are missing, the archive is downloaded (where the network allows) and unpacked.
"""
from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np

from netrun.errors import NetrunError
from netrun.train.data import download
from netrun.train.data.base import Arrays, DataSource, SourceRequest, register_source
from netrun.train.data.paths import resolve_data_dir

ARCHIVE = "cifar-10-binary.tar.gz"
FOLDER = "cifar-10-batches-bin"
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)
RECORD = 1 + 3 * 32 * 32


def read_batches(paths: list[Path]) -> Arrays:
    """Concatenate CIFAR-10 binary batch files into (N, 3, 32, 32) float32 and int32 labels."""
    chunks = []
    for path in paths:
        raw = np.fromfile(path, dtype=np.uint8)
        if raw.size == 0 or raw.size % RECORD:
            raise NetrunError(f"{path}: {raw.size} bytes is not a whole number of CIFAR-10 "
                              f"records ({RECORD} bytes each); the file is truncated or not "
                              f"CIFAR-10")
        chunks.append(raw.reshape(-1, RECORD))
    records = np.concatenate(chunks)
    labels = records[:, 0].astype(np.int32)
    if labels.max() > 9:
        raise NetrunError(f"{paths[0]}: label {int(labels.max())} is not a class 0-9")
    images = records[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32)   # (N, C, H, W)
    return Arrays(images, labels)


class Cifar10Source(DataSource):
    """CIFAR-10: 50,000 training and 10,000 test images of 10 classes."""

    name = "cifar10"
    input_shape = (3, 32, 32)
    num_classes = 10

    def __init__(self, directory: Path, download_ok: bool = True, origin: str = ""):
        super().__init__()
        self.directory, self.download_ok, self.origin = Path(directory), download_ok, origin

    def describe(self) -> str:
        return f"cifar10 from {self.directory}"

    def _load(self, part: str) -> Arrays:
        names = TRAIN_FILES if part == "train" else TEST_FILES
        return read_batches(self._locate(names))

    def _locate(self, names: tuple[str, ...]) -> list[Path]:
        for folder in (self.directory / FOLDER, self.directory):
            if all((folder / n).is_file() for n in names):
                return [folder / n for n in names]
        problem = "downloading is off (download: false)"
        if self.download_ok:
            try:
                download.download_files("cifar10", [ARCHIVE], self.directory)
                _unpack(self.directory / ARCHIVE, self.directory)
                return [self.directory / FOLDER / n for n in names]
            except download.DownloadError as e:
                problem = str(e)
        raise NetrunError(f"cifar10: {', '.join(names)} missing from {self.directory} "
                          f"({self.origin}); {problem}. To fix: unpack {ARCHIVE} there, point "
                          f"NETRUN_DATA at a folder that holds cifar10/, or pass --data-dir.")


def _unpack(archive: Path, directory: Path) -> None:
    """Extract only the expected batch files (never arbitrary paths from the archive)."""
    wanted = {f"{FOLDER}/{n}" for n in TRAIN_FILES + TEST_FILES + ("batches.meta.txt",)}
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name in wanted and m.isfile()]
        tar.extractall(directory, members=members)


@register_source("cifar10", "cifar-10")
def make_cifar10(request: SourceRequest) -> Cifar10Source:
    """`cifar10`: the binary CIFAR-10 batches in the data folder."""
    directory, origin = resolve_data_dir("cifar10", request.data_dir, request.config_dir)
    return Cifar10Source(directory, bool(request.cfg.get("download", True)), origin)
