"""Every file kvspec writes goes through here: nothing of the user's is deleted or half-written.

* ``write_output_file`` — one named file (``explain --svg``, ``bench --plot``, ``verify --junit``): refused
  when the path is a directory or its folder does not exist; written to a temporary file beside it and
  renamed over it, so a failure leaves the old file (or none), never a partial one.
* ``replace_vectors_tree`` — ``kvspec vectors --out DIR``: writes into a new folder; an empty folder is
  filled; an existing vectors tree (nothing but ``meta.json`` / ``input.json`` / ``expected.json`` files,
  every case with its ``meta.json``) is replaced only with ``--force``; any other non-empty folder is
  refused, with or without ``--force``, and nothing in it is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from kvspec.spec.errors import SpecError

RULE_OUTPUT = "output-file"
RULE_OUTPUT_DIR = "output-dir"
VECTOR_FILES = frozenset({"meta.json", "input.json", "expected.json"})


def write_output_file(path: str, data: str | bytes) -> None:
    """Write `data` to `path` atomically (temp file + rename); raise SpecError(output-file) when it can't be."""
    target = Path(path)
    if target.is_dir():
        raise SpecError(RULE_OUTPUT, f"{path} is a directory; name a file")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise SpecError(RULE_OUTPUT, f"cannot write {path}: its folder {folder} does not exist")
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, mode) as f:
                f.write(data)
            os.chmod(tmp, _file_mode(target))  # mkstemp's 0600 would outlive the rename
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise SpecError(RULE_OUTPUT, f"cannot write {path}: {exc.strerror or exc}") from None


def _file_mode(target: Path) -> int:
    """Return the mode the written file gets: the replaced file's, else 0666 less the process's umask."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def find_foreign_files(root: Path) -> list[Path]:
    """Return the files under `root` that a vectors tree does not hold (any name but the three case files,
    a case folder without meta.json, a meta.json that is not a vector's), and every non-regular entry."""
    foreign: list[Path] = []
    for p in sorted(root.rglob("*")):
        if p.is_symlink() or not (p.is_dir() or p.is_file()):
            foreign.append(p)
        elif p.is_file():
            if p.name not in VECTOR_FILES:
                foreign.append(p)
            elif p.name == "meta.json":
                try:
                    meta = json.loads(p.read_text())
                except (OSError, ValueError):
                    foreign.append(p)
                    continue
                if not isinstance(meta, dict) or "format" not in meta or "rules" not in meta:
                    foreign.append(p)
            elif not (p.parent / "meta.json").is_file():
                foreign.append(p)
    return foreign


def replace_vectors_tree(out: Path, write: Callable[[Path], None], force: bool = False) -> None:
    """Write a vectors tree at `out` by calling `write(folder)` on a new folder, then moving it into place.

    Refused (SpecError output-dir, nothing touched) when `out` is a file, a non-empty folder that is not a
    vectors tree, or a vectors tree without `force`."""
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            raise SpecError(RULE_OUTPUT_DIR, f"{out} exists and is not a folder; name a new or empty folder")
        if any(out.iterdir()):
            foreign = find_foreign_files(out)
            if foreign:
                shown = ", ".join(str(p.relative_to(out)) for p in foreign[:3])
                more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
                raise SpecError(RULE_OUTPUT_DIR, f"{out} holds files that are not test vectors ({shown}{more}); "
                                                 "kvspec vectors writes only to a new folder, an empty one, or an "
                                                 "existing vectors tree with --force")
            if not force:
                raise SpecError(RULE_OUTPUT_DIR, f"{out} already holds a vectors tree; add --force to replace it")
    parent = out.resolve().parent if out.exists() else out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.new.", dir=parent))
    try:
        write(staging)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=parent))
            os.replace(out, old / "tree")
            os.replace(staging, out)
            shutil.rmtree(old)
        else:
            os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
