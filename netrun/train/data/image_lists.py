"""Which image files make a dataset, with their labels: Caffe's list files and folders with
one subfolder per class."""
from __future__ import annotations

import os
from pathlib import Path

from netrun.errors import DataError
from netrun.train.data.images import IMAGE_SUFFIXES


def read_list_file(path: str | os.PathLike, root_folder: str | os.PathLike = ""
                   ) -> list[tuple[Path, int]]:
    """(image path, label) per line of a Caffe list file ("path label"; the label follows the
    last space or tab, so paths may hold spaces). Relative paths resolve against `root_folder`,
    else the list file's folder. Blank lines are skipped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DataError(f"{path}: cannot read the image list ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: the image list is not UTF-8 text") from None
    base = Path(root_folder) if str(root_folder) else path.parent
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        fields = line.rsplit(maxsplit=1)
        if len(fields) != 2:
            raise DataError(f"{path}:{number}: expected 'IMAGE_PATH LABEL', got '{line[:120]}'")
        name, label = fields
        try:
            value = int(label)
        except ValueError:
            raise DataError(f"{path}:{number}: the label '{label[:40]}' is not a whole "
                            f"number (a line is 'IMAGE_PATH LABEL')") from None
        if value < 0:
            raise DataError(f"{path}:{number}: negative label {value}")
        entries.append((base / name, value))
    if not entries:
        raise DataError(f"{path}: the image list is empty")
    return entries


def scan_folder(root: str | os.PathLike) -> tuple[list[tuple[Path, int]], list[str]]:
    """(image path, label) for every image under `root`/CLASS/, and the class names: sorted
    subfolder names, label = index. Files are sorted by path; only IMAGE_SUFFIXES count (any
    case). Nested folders count, but not symbolic links to folders (which could loop)."""
    root = Path(root)
    classes = class_names(root)
    return folder_images(root, classes), classes


def class_names(root: str | os.PathLike) -> list[str]:
    """The sorted names of the class subfolders of `root` (hidden ones left out)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such folder (expected one subfolder of images per class)")
    classes = _subfolders(root)
    if not classes:
        raise DataError(f"{root}: no class subfolders (put the images of each class in a "
                        f"subfolder named after it)")
    return classes


def _subfolders(root: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise DataError(f"{root}: cannot list the folder ({e.strerror or e})") from None


def folder_images(root: Path, classes: list[str]) -> list[tuple[Path, int]]:
    """(image path, label) under root/CLASS for the given classes (label: index in
    `classes`); a subfolder of `root` not in `classes` is a DataError."""
    unknown = [name for name in _subfolders(root) if name not in classes]
    if unknown:
        raise DataError(f"{root}: class folder(s) {', '.join(unknown[:5])} are not among the "
                        f"training classes ({', '.join(classes[:10])}"
                        f"{', ...' if len(classes) > 10 else ''})")
    entries = []
    for label, name in enumerate(classes):
        if (root / name).is_dir():
            entries += [(f, label) for f in images_under(root / name)]
    if not entries:
        raise DataError(f"{root}: no images in the class folders (looked for "
                        f"{', '.join(IMAGE_SUFFIXES)})")
    return entries


def images_under(folder: Path) -> list[Path]:
    """The image files in `folder` and below it, sorted (hidden files and folders skipped)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found += [Path(dirpath, f) for f in filenames
                  if not f.startswith(".") and f.lower().endswith(IMAGE_SUFFIXES)]
    return sorted(found)


# Written by `netrun data build` into a database made from a folder of class subfolders: one
# name per line, in label order. LMDB and LevelDB both ignore files they did not write.
CLASSES_FILE = "classes.txt"


def read_class_names(path: str | Path) -> list[str] | None:
    """The class names `build_database` wrote beside a database, or None if there are none."""
    file = Path(path) / CLASSES_FILE
    if not file.is_file():
        return None
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{file}: cannot read the class names ({e})") from None
    return text.splitlines()
