"""Reading users' zip-based files (.npz, torch files) without surprises.

``check_zip(path)`` looks at a zip's directory before anything is inflated: a member that
would inflate far beyond the file's own size (a zip bomb: 2 MB becoming 3.5 GB) is refused.
``load_npz(path)`` reads a .npz of plain numeric arrays: it checks the file is a zip at all (random
bytes would otherwise reach numpy's pickle loader and its allow_pickle message), that every
array's header declares no more data than its member holds (a 4 KB file declaring 10^12 rows),
and turns any failure of the format into one ``ValueError`` naming the file.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

# inflating more than this many times the file's size, past MIN_BOMB bytes, is a bomb:
# real feature files and learner states compress by a few times at most
MAX_RATIO = 50
MIN_BOMB = 64 << 20


class ArchiveError(ValueError):
    """A zip-based file that cannot be read safely; the message names the file."""


def check_zip(path: str | Path, what: str = "file", *,
              verify: bool = True) -> list[zipfile.ZipInfo]:
    """The members of the zip ``path`` after checking its declared sizes (no data inflated),
    that no two members share a name (a reader would silently use one of them), and, with
    ``verify``, every member's checksum: a zip stores the CRC-32 of each member (numpy.savez
    and torch.save write it), so a flipped bit in a learner file, a checkpoint's tensors or a
    features file is refused here instead of changing the numbers it holds."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
    except zipfile.BadZipFile:
        raise ArchiveError(f"{path}: not a readable {what}: not a zip archive (numpy.savez "
                           "and torch.save write zip archives)") from None
    except (ValueError, OverflowError, NotImplementedError) as e:  # a damaged directory
        raise ArchiveError(f"{path}: not a readable {what}: damaged zip directory "
                           f"({type(e).__name__}: {e})") from None
    names = [m.filename for m in members]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ArchiveError(f"{path}: damaged {what}: member(s) {', '.join(map(repr, twice))} "
                           "stored twice (which one would be read is arbitrary)")
    size = max(1, path.stat().st_size)
    total = sum(m.file_size for m in members)
    if total > MIN_BOMB and total > MAX_RATIO * size:
        raise ArchiveError(f"{path}: its {size} bytes would inflate to {total} bytes "
                           f"(over {MAX_RATIO} times the file's size): refused as a zip bomb")
    if verify:
        _verify_members(path, what)
    return members


def _verify_members(path: Path, what: str) -> None:
    """Every member reads back whole and matches its stored CRC-32."""
    member = None
    try:
        with zipfile.ZipFile(path) as z:
            for member in z.infolist():
                with z.open(member) as f:
                    while f.read(1 << 20):
                        pass
    except (zipfile.BadZipFile, EOFError, ValueError, zlib.error, NotImplementedError) as e:
        where = f"member {member.filename!r}" if member is not None else "its directory"
        raise ArchiveError(f"{path}: not a readable {what} (damaged): {where} does not match "
                           f"its checksum or cannot be read ({type(e).__name__}: {e}); the file "
                           "changed after it was written") from None


def _check_header(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> None:
    """The .npy header of ``info`` declares no more bytes than the member holds."""
    with z.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=10000)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=10000)
        header = f.tell()
    if dtype.hasobject:
        raise ArchiveError(f"{path}: array {info.filename} holds Python objects (pickles are "
                           "refused); save plain numeric arrays")
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if declared > info.file_size - header:
        raise ArchiveError(f"{path}: array {info.filename} declares shape {shape} of {dtype} "
                           f"({declared} bytes) but holds {info.file_size - header} bytes")


def load_npz(path: str | Path, what: str = ".npz file") -> dict[str, np.ndarray]:
    """Every array of the .npz ``path``, checked as the module docstring says."""
    path = Path(path)
    members = check_zip(path, what)
    try:
        with zipfile.ZipFile(path) as z:
            for info in members:
                if info.filename.endswith(".npy"):
                    _check_header(z, info, path)
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except ArchiveError:
        raise
    except Exception as e:  # zip, zlib, npy header and numpy errors alike: a damaged file
        raise ArchiveError(f"{path}: not a readable {what}: {type(e).__name__}: {e}") from None
