"""The idempotency ids a served learner remembers: the last ``count`` ids, and never more than
``nbytes`` of them as written to the snapshot's ids file (a compact JSON list of
``[seq, id]``), so that whatever the writer keeps, the reader accepts (``MAX_IDS_FILE``)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

from ciosl.fileio import atomic_write_bytes, load_json

MAX_IDS_FILE = 512 * 2**20  # the most an ids file may hold for the reader
MAX_WINDOW_BYTES = 256 * 2**20  # the most ``--id-window-bytes`` may be: well under the cap


def entry_bytes(seq: int, rid: str) -> int:
    """The bytes of ``[seq,"rid"],`` in the ids file (JSON with ASCII escapes)."""
    return len(json.dumps(rid)) + len(str(seq)) + 4


class IdWindow:
    """The last ids acknowledged, oldest first: at most ``count`` of them and ``nbytes`` of
    ids file."""

    def __init__(self, count: int, nbytes: int):
        self.count, self.nbytes = count, nbytes
        self._ids: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.size = 2  # the file's "[]"

    def __contains__(self, rid: object) -> bool:
        return rid in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def seq_of(self, rid: str) -> int:
        return self._ids[rid]

    def add(self, rid: str | None, seq: int) -> None:
        if rid is None:
            return
        old = self._ids.pop(rid, None)
        if old is not None:
            self.size -= entry_bytes(old, rid)
        self._ids[rid] = seq
        self.size += entry_bytes(seq, rid)
        while len(self._ids) > self.count or (self.size > self.nbytes and self._ids):
            gone, q = self._ids.popitem(last=False)
            self.size -= entry_bytes(q, gone)

    def items(self) -> list[tuple[int, str]]:
        return [(q, rid) for rid, q in self._ids.items()]

    def write(self, path: Path) -> None:
        data = json.dumps([[q, rid] for rid, q in self._ids.items()],
                          separators=(",", ":")).encode()
        if len(data) > MAX_IDS_FILE:  # never: the window's bound is below it
            raise RuntimeError(f"{path}: {len(data)} bytes of ids, more than a reader takes")
        atomic_write_bytes(path, data)


def read_ids(path: Path) -> list[tuple[int, str]]:
    """The ``[seq, id]`` pairs of an ids file (``ValueError`` when it is not one)."""
    doc = load_json(path, "ids file", limit=MAX_IDS_FILE)
    if not isinstance(doc, list):
        raise ValueError(f"ids file {path}: not a list")
    return [(int(q), rid) for q, rid in doc]
