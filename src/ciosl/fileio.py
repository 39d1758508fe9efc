"""Crash-safe file writes (temporary file in the same folder, fsync, atomic rename) and bounded
reads (regular files only, at most a cap)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ciosl.errors import writing


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename; an ``OSError`` (a full
    disk) names ``path``, not the temporary. The missing folders of ``path`` as given are
    created; never those of a symbolic link's target (``_destination``)."""
    if str(path) == "":  # Path("") is ".", the current folder
        raise ValueError("cannot write to an empty path ''; give a file name")
    path = Path(path)
    with writing(path):
        return _atomic_write_bytes(path, data)


def _atomic_write_bytes(path: Path, data: bytes) -> Path:
    path = _destination(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        refuse_dangling(path.parent)  # a dangling link among the folders: say so
        raise
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _destination(path: Path) -> Path:
    """Where a write to ``path`` goes: a symbolic link's target (the link stays a link), and
    only ever a regular file: a FIFO, a device, a folder or a socket there is refused, never
    replaced by the rename (an ``OSError`` naming it). A dangling link is written through only
    when its target's folder exists: no folder is ever created along a link."""
    if path.is_symlink():
        target = Path(os.path.realpath(path))
        if not target.parent.is_dir():
            raise OSError(errno.ENOENT, dangling_text(path, target, named=False) + ": refused to create "
                          "folders along it (remove the link, or create the folder first)",
                          str(path))
        path = target
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if not stat.S_ISREG(mode):
        raise OSError(errno.EEXIST, f"not a regular file ({kind_of(mode)}): refused to "
                      "replace it", str(path))
    return path


def dangling_link(path: str | Path) -> Path | None:
    """``path`` or its nearest folder above that is a symbolic link to nothing, else None."""
    path = Path(path)
    for p in (path, *path.parents):
        if os.path.islink(p) and not os.path.exists(p):
            return p
    return None


def dangling_text(link: Path, target: Path | None = None, *, named: bool = True) -> str:
    """``LINK: a dangling symbolic link (to TARGET, which does not exist)`` (``named``: with
    ``LINK: ``)."""
    to = os.readlink(link) if target is None else target
    return (f"{link}: " if named else "") + f"a dangling symbolic link (to {to}, which does " \
        "not exist)"


def refuse_dangling(path: str | Path, what: str = "", advice: str = "") -> None:
    """``ValueError`` naming a dangling link at ``path`` or above it (``what``: the flag or
    the kind of file, to start the message), if there is one."""
    link = dangling_link(path)
    if link is None:
        return
    where = "" if not what else f"{what} " if link == Path(path) else f"{what} {path}: "
    raise ValueError(where + dangling_text(link) + (f": {advice}" if advice else
                     ": refused (ciosl never creates folders along a link); remove the link, "
                     "or create its target first"))


class ClaimedError(ValueError):
    """Another process is writing the same file right now (``claim``)."""


@contextlib.contextmanager
def claim(path: str | Path, holder: str) -> Iterator[None]:
    """Hold, for the block, the only claim to write ``path``: a lock on ``.NAME.lock`` next to
    it (``flock``: the kernel releases it when the process ends, however it ends, so a killed
    run leaves no stale claim and ``--resume`` works at once). A second claimant gets
    ``ClaimedError`` naming ``path`` and the ``holder`` text of the first (its pid and what it
    computes). Where the file system has no such locks the block runs unclaimed."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 1000).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise ClaimedError(f"{path} is being computed by another ciosl process right now "
                               f"({other})") from None
        except OSError:  # no locks here (some network file systems)
            os.close(fd)
            yield
            return
        try:  # the holder before may have removed the file between our open and our lock
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        try:  # a full disk names the lock file, not only "No space left on device"
            os.ftruncate(fd, 0)
            os.write(fd, holder.encode())
        except OSError as e:
            raise OSError(e.errno, f"cannot write the lock file of {path.name} "
                          f"({e.strerror or e})", str(lock)) from None
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def check_writable(folder: str | Path, what: str = "--out") -> Path:
    """Create ``folder`` if needed and check a file can be written in it, before any work (a
    run that computes for hours and then cannot write its result has lost everything)."""
    folder = Path(folder)
    refuse_dangling(folder, what, advice=f"refused before any work (ciosl never creates folders "
                    f"along a link); create its target folder, or choose another {what}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".ciosl-write-check.", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        why = e.strerror or type(e).__name__
        try:
            mode = folder.stat().st_mode
            if not stat.S_ISDIR(mode):  # "File exists" would not say what is in the way
                why = f"it is {kind_of(mode)}, not a folder"
        except OSError:
            pass
        raise ValueError(f"{what} {folder}: cannot write there ({why})") from None
    return folder


def cache_root() -> Path:
    """``$CIOSL_CACHE`` or ``~/.cache/ciosl``: feature caches and offline reference results."""
    env = os.environ.get("CIOSL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ciosl"


# ---------------------------------------------------------------------------- bounded reads
# Every reader opens regular files only (a FIFO blocks forever, /dev/zero never ends) and reads
# at most a cap: a wrong path given where a result, grid, checkpoint or learner file is expected
# gets one line naming it, never a hang or an out-of-memory.

MAX_JSON_BYTES = 512 * 2**20  # a result JSON: per-class counts of 10,000 classes fit easily
MAX_TEXT_BYTES = 16 * 2**20  # a grid (TOML) or another small text file
MAX_BINARY_BYTES = 64 * 2**30  # checkpoints, learner files, feature files


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path: str | Path, what: str, mode: int) -> ValueError:
    return ValueError(f"{what} {path}: not a regular file ({kind_of(mode)})")


def check_regular(path: str | Path, what: str = "file",
                  limit: int | None = MAX_BINARY_BYTES) -> Path:
    """``path`` if it is a regular file (symbolic links followed) of at most ``limit`` bytes;
    for readers that hand the path to another library (``torch.load``, ``np.load``, zipfile).
    Raises ``FileNotFoundError`` if it is missing, ``ValueError`` naming ``what`` otherwise."""
    path = Path(path)
    st = os.stat(path)  # FileNotFoundError / PermissionError name the path
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, what, st.st_mode)
    if limit is not None and st.st_size > limit:
        raise ValueError(f"{what} {path}: {st.st_size} bytes, more than the {limit} this "
                         "reader accepts")
    return path


def open_regular(path: str | Path, what: str = "file") -> BinaryIO:
    """``open(path, "rb")`` for a regular file only: opened without blocking (a FIFO with no
    writer would block ``open`` itself), then refused unless ``fstat`` says regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, what, st.st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, what: str = "file", limit: int = MAX_BINARY_BYTES) -> bytes:
    """The bytes of the regular file ``path``, refused (``ValueError`` naming ``what``) if it
    holds more than ``limit``."""
    with open_regular(path, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what} {path}: larger than the {limit} bytes this reader accepts")
    return data


def read_text(path: str | Path, what: str = "file", limit: int = MAX_TEXT_BYTES) -> str:
    """``read_bytes`` decoded as UTF-8, with the file and the byte named on a bad encoding."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path}: not UTF-8 text (byte {e.start}: "
                         f"{data[e.start:e.start + 1]!r})") from None


def load_json(path: str | Path, what: str = "JSON file", limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON in the regular file ``path``; ``ValueError`` naming it when it is not one."""
    text = read_text(path, what, limit)
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} {path}: nested too deeply") from None
    except ValueError as e:
        raise ValueError(f"{what} {path}: not valid JSON ({e})") from None


def read_json(path: str | Path) -> Any | None:
    """The JSON in ``path``, or None if it is missing, not a regular file, too large or
    unreadable (then it is rebuilt)."""
    try:
        return load_json(path)
    except (OSError, ValueError):
        return None
