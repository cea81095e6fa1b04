"""Finding the files a Caffe prototxt names: paths in Caffe's examples are relative to the
Caffe source tree (examples/mnist/lenet_train_test.prototxt), which is rarely where we run."""
from __future__ import annotations

from pathlib import Path


def candidates(path: str, base: Path) -> list[Path]:
    """Where `path` may be: relative to `base`, as given (from the working directory, as
    Caffe reads it), then its basename in `base`."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return [p, base / p.name]
    return [base / p, p, base / p.name]


def find_file(path: str, base: Path) -> Path | None:
    """The first existing file among candidates(path, base), or None."""
    return next((c for c in candidates(path, base) if c.is_file()), None)
