"""Single-file outputs (`visualize --out`, `explore --out`, `benchmark --json`): the tag that says we wrote a
file, the check before replacing one, and the digest that names the model a page or a report was made from."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from .paths import check_can_make, check_not_under_a_file

WRITTEN_BY = "hf_minitx"  # the tag our single-file outputs carry (PNG text chunk "Software", JSON "written_by")
HTML_TAG = f'<meta name="generator" content="{WRITTEN_BY}">'  # the tag our HTML pages carry in their head


def check_output_file(path: str | Path, *, overwrite: bool, option: str, is_ours: Callable[[Path], bool]) -> Path:
    """Refuse a folder, a path under a file, or an existing file we did not write, unless ``overwrite``.
    Returns the path (its missing parent folders are made when it is written); a symlink is resolved to the file it
    names, as a linked folder is, so that writing replaces that file and leaves the link in place."""
    out = Path(path).expanduser()
    if out.is_symlink() or ".." in out.parts:  # a link to an earlier page stays a link: the page it points to is
        out = out.resolve()  # replaced; `a/../b` is b, so no folder a is made on the way
    if out.is_dir():
        raise IsADirectoryError(f"{option} {out} is a folder; give a file path")
    check_not_under_a_file(out, option=option)
    check_can_make(out.parent, option=option, named=out)  # a folder the system will not create, before any work
    if out.exists() and not overwrite and not is_ours(out):
        raise FileExistsError(
            f"{option} {out} exists and was not written by minitx; pass --overwrite to replace it, or choose "
            "another file name"
        )
    return out


def html_written_by_us(path: Path) -> bool:
    """Whether the HTML page at ``path`` carries our tag (in its first 2 kB, where the head is)."""
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            return HTML_TAG in handle.read(2048)
    except OSError:
        return False


def weights_digest(model_dir: Path) -> str:
    """SHA-256 of a model folder's weight files (every ``*.safetensors`` at its top, in name order; a checkpoint
    that holds ``*.bin`` weights instead, those): what names the exact model a page or a report was made from."""
    digest = hashlib.sha256()
    files = sorted(Path(model_dir).glob("*.safetensors")) or sorted(Path(model_dir).glob("*.bin"))
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
