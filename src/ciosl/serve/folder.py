"""A served learner's folder: claimed by one server (``.lock``), described by
``ciosl-serve.json``. Nothing is written into a folder before it is known to be a new one or
this server's: an unrelated folder, ``--dir ''`` or a dangling link is refused untouched."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ciosl.errors import echo
from ciosl.fileio import atomic_write_json, dangling_link, dangling_text, load_json
from ciosl.learners.registry import class_path, get_method, resolve_method
from ciosl.serve import wal

FORMAT = "ciosl-serve"
VERSION = 1
META = "ciosl-serve.json"
POINTER = "snapshot.json"
KNOWN = {META, POINTER, "snapshots", "log", "token", ".lock", "predictions.bin"}
# what a root of many learners holds besides them (hub.py): never "other files"
HUB_ENTRIES = {"learners", ".trash", ".hub.lock", "extractor.json"}  # images.PIN


class ServeError(ValueError):
    """A folder or a setting the server refuses (one line)."""


def check_name(folder: str | Path) -> None:
    """An empty ``--dir`` is refused (``Path("")`` would be the current folder)."""
    if isinstance(folder, str) and folder.strip() == "":
        raise ServeError("--dir '': give a folder (an empty name is not taken as the current "
                         "folder)")


def check_place(folder: str | Path) -> Path:
    """``folder`` if a server may claim it: not empty text, not a dangling link, not a file,
    and either new, empty or a ciosl serve folder. Reads only."""
    check_name(folder)
    f = Path(folder)
    link = dangling_link(f)  # the folder, or one above it
    if link is not None:
        where = f"--dir {dangling_text(link)}" if link == f else \
            f"--dir {f}: {dangling_text(link)}"
        raise ServeError(f"{where}; create its target or give another --dir")
    if f.exists() and not f.is_dir():
        raise ServeError(f"--dir {f}: not a folder")
    if f.is_dir() and not (f / META).exists():
        others = sorted(p.name for p in f.iterdir()
                        if p.name not in {".lock", "token", *HUB_ENTRIES})
        if others:
            raise ServeError(f"--dir {f}: not a ciosl serve folder (no {META}; it holds "
                             f"{', '.join(others[:3])}{'...' if len(others) > 3 else ''})")
    return f


def claim(folder: Path) -> int:
    """Create the folder if new and hold its ``.lock``; the lock's descriptor."""
    check_place(folder)
    return hold(folder, ".lock")


def hold(folder: Path, lock: str, hint: str = "") -> int:
    """Create ``folder`` if new and hold its file ``lock`` (one server at a time); the lock's
    descriptor (closing it releases the lock). ``hint`` ends the line said when it is held."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise ServeError(f"--dir {folder}: cannot use it ({e.strerror or e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ServeError(f"--dir {folder}: in use by another ciosl serve (it holds "
                         f"{folder / lock}){hint}") from None
    return fd


def check_meta(f: Path, method: str | None, settings: dict | None) -> tuple[str, dict]:
    """The method and settings the folder serves (a new folder is described by them)."""
    meta_path = f / META
    if not meta_path.exists():
        check_place(f)  # again, under the lock
        if method is None:
            raise ServeError(f"--dir {f} is new: give --method")
        from ciosl.serve.service import settings_for

        if settings is None:
            settings = settings_for(method, {})
        cls = get_method(method)
        method = cls.name
        (f / "snapshots").mkdir(exist_ok=True)
        (f / "log").mkdir(exist_ok=True)
        atomic_write_json(meta_path, {"format": FORMAT, "version": VERSION,
                                      "method": method, "class": class_path(cls),
                                      "settings": settings})
        wal.fsync_dir(f)
        return method, settings
    try:
        meta = load_json(meta_path, META)
    except ValueError as e:
        raise ServeError(f"--dir {f}: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ServeError(f"{meta_path}: not a ciosl serve folder description")
    if meta.get("version") != VERSION:
        raise ServeError(f"{meta_path}: serve format version {meta.get('version')!r}, this "
                         f"ciosl reads {VERSION}")
    if method is not None and get_method(method).name != meta["method"]:
        raise ServeError(f"--dir {f} serves method {meta['method']!r}, not "
                         f"{get_method(method).name!r}; use another --dir or that method")
    if settings is not None and settings != meta["settings"]:
        diff = sorted(k for k in {*settings, *meta["settings"]}
                      if settings.get(k) != meta["settings"].get(k))
        shown = ", ".join(f"{k}={echo(meta['settings'].get(k))}" for k in diff[:3])
        raise ServeError(f"--dir {f} serves {meta['method']} with other settings ({shown}); "
                         "start it without --set, or use another --dir")
    try:  # a learner of the user's own: its class, imported by the path recorded
        resolve_method(meta["method"], meta.get("class"), str(meta_path), cwd=True)
    except ValueError as e:
        raise ServeError(str(e)) from None
    for sub in ("snapshots", "log"):
        if not (f / sub).is_dir():
            raise ServeError(f"--dir {f}: {sub}/ is missing; the folder is damaged")
    return meta["method"], meta["settings"]
