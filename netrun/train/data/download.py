"""Fetch dataset files from the recipe URLs: verified (size, MD5, SHA-256) and atomic.

The recipes live in `recipes.yaml` beside this module (package data, so an installed netrun
has them too). A file is written to a hidden temporary name beside its destination, checked,
fsynced and renamed into place, so an interrupted or corrupt download never leaves a file
that looks complete. When a recipe
has no SHA-256 yet, the digest of the first verified download is appended to `SHA256SUMS`
in the data folder, to be copied into the recipe (see data/README.md).
"""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from netrun.errors import NetrunError
from netrun.util import safe_yaml
from netrun.util.progress import activity

RECIPES = Path(__file__).resolve().with_name("recipes.yaml")
log = logging.getLogger("netrun.data")


class DownloadError(NetrunError):
    """No mirror delivered a file; `reasons` maps each file to why its last attempt failed."""

    def __init__(self, message: str, reasons: dict[str, str]):
        super().__init__(message)
        self.reasons = reasons


def load_recipes(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The dataset recipes (name -> {urls, files: {name: {bytes, md5, sha256}}})."""
    path = Path(path) if path is not None else RECIPES
    recipes = safe_yaml.safe_load(safe_yaml.read_text(path), str(path))
    if not isinstance(recipes, dict):
        raise NetrunError(f"{path}: expected a mapping of dataset names to recipes")
    return recipes


def fetch(url: str, dest: Path, *, size: int | None = None, md5: str | None = None,
          sha256: str | None = None, timeout: float = 30.0) -> str:
    """Download `url` to `dest` atomically after checking size and digests; return SHA-256."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    digest_md5, digest_sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    received = 0
    request = urllib.request.Request(url, headers={"User-Agent": "netrun-data/1"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            dest.parent.mkdir(parents=True, exist_ok=True)    # only once a server answers
            with open(tmp, "wb") as out:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    digest_md5.update(chunk)
                    digest_sha.update(chunk)
                    received += len(chunk)
                out.flush()
                os.fsync(out.fileno())
        _verify(received, digest_md5.hexdigest(), digest_sha.hexdigest(), size, md5, sha256)
        os.replace(tmp, dest)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        _remove(tmp)
        reason = getattr(e, "reason", None) or e
        raise NetrunError(f"{url}: {reason}") from None
    except BaseException:
        _remove(tmp)
        raise
    return digest_sha.hexdigest()


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _verify(received: int, got_md5: str, got_sha: str, size: int | None,
            md5: str | None, sha256: str | None) -> None:
    if size is not None and received != size:
        raise ValueError(f"got {received} bytes, the recipe says {size}")
    if md5 and got_md5 != md5.lower():
        raise ValueError(f"MD5 {got_md5} does not match the recipe's {md5}")
    if sha256 and got_sha != sha256.lower():
        raise ValueError(f"SHA-256 {got_sha} does not match the recipe's {sha256}")


def download_files(dataset: str, names: list[str], directory: Path,
                   recipes: dict[str, Any] | None = None, timeout: float = 30.0) -> None:
    """Fetch each of `names` of `dataset` into `directory`, trying the mirrors in order."""
    if recipes is None:
        try:
            recipes = load_recipes()
        except NetrunError as e:
            raise DownloadError(str(e), {n: "no recipe" for n in names}) from None
    recipe = recipes.get(dataset)
    if not isinstance(recipe, dict):
        raise DownloadError(f"no download recipe for '{dataset}'", {n: "no recipe" for n in names})
    reasons: dict[str, str] = {}
    for name in names:
        spec = (recipe.get("files") or {}).get(name)
        if spec is None:
            reasons[name] = f"not in the '{dataset}' recipe"
            continue
        for base in spec.get("urls") or recipe.get("urls") or []:
            url = base if not base.endswith("/") else base + name
            log.info("downloading %s", url)
            try:
                with activity(f"downloading {url}"):
                    digest = fetch(url, directory / name, size=spec.get("bytes"),
                                   md5=spec.get("md5"), sha256=spec.get("sha256"),
                                   timeout=timeout)
            except NetrunError as e:
                reasons[name] = str(e)
                continue
            reasons.pop(name, None)
            if not spec.get("sha256"):
                _record_sha256(directory, name, digest)
            break
        else:
            reasons.setdefault(name, "the recipe lists no URL")
    if reasons:
        first = next(iter(reasons.values()))
        more = f"; {len(reasons) - 1} more file(s) failed too" if len(reasons) > 1 else ""
        raise DownloadError(f"the download failed ({first}{more})", reasons)


def _record_sha256(directory: Path, name: str, digest: str) -> None:
    # The recipe had no SHA-256: keep the verified (size + MD5) file's digest beside it,
    # in `sha256sum` format, so a maintainer can copy it into the recipes.
    log.warning("%s: SHA-256 %s (not yet in netrun/train/data/recipes.yaml; recorded in %s)",
                name, digest,
                directory / "SHA256SUMS")
    try:
        with open(directory / "SHA256SUMS", "a") as f:
            f.write(f"{digest}  {name}\n")
    except OSError:
        pass
