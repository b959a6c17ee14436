"""PostgreSQL's binary wire formats written by numpy: one-dimensional arrays (with their psycopg
dumpers) and the rows of a binary ``COPY``.

psycopg dumps a Python list element by element in Python (about 1 µs per element); numpy writes
the same bytes for a whole column at once. The PostgreSQL storage strategy
(``backend.storage.postgresql``) sends every bulk-written column this way, as an array on
connections it has ``register``-ed the dumpers on, or as ``copy_rows`` for a ``COPY``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from psycopg.adapt import AdaptersMap, Dumper
from psycopg.pq import Format


class PgArray:
    """A one-dimensional PostgreSQL array already in binary wire format.

    Fixed-width element types only; a NULL float is sent as NaN and turned back into NULL in
    SQL with ``NULLIF(x, 'NaN')``.
    """

    elem_oid: ClassVar[int]
    dtype: ClassVar[str]  # numpy big-endian element dtype
    __slots__ = ("data",)

    def __init__(self, values: Any) -> None:
        arr = np.asarray(values, dtype=self.dtype)
        n = len(arr)
        if n == 0:
            self.data = struct.pack(">iiI", 0, 0, self.elem_oid)
            return
        body = np.empty(n, dtype=[("len", ">i4"), ("v", self.dtype)])
        body["len"] = arr.dtype.itemsize
        body["v"] = arr
        self.data = struct.pack(">iiIii", 1, 0, self.elem_oid, n, 1) + body.tobytes()


class Int4Array(PgArray):
    elem_oid, dtype = 23, ">i4"


class Int8Array(PgArray):
    elem_oid, dtype = 20, ">i8"


class Float8Array(PgArray):
    elem_oid, dtype = 701, ">f8"


class BoolArray(PgArray):
    elem_oid, dtype = 16, "u1"


def _array_dumper(array_oid: int) -> type[Dumper]:
    class _Dumper(Dumper):
        format = Format.BINARY
        oid = array_oid

        def dump(self, obj: Any) -> bytes:
            return obj.data

    return _Dumper


_DUMPERS = [
    (cls, _array_dumper(oid))
    for cls, oid in ((Int4Array, 1007), (Int8Array, 1016), (Float8Array, 1022), (BoolArray, 1000))
]


def register(adapters: AdaptersMap) -> None:
    """Let a connection's ``adapters`` send the arrays as query parameters."""
    for cls, dumper in _DUMPERS:
        adapters.register_dumper(cls, dumper)


COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)  # signature, flags, no extension
COPY_TRAILER = struct.pack(">h", -1)


def copy_rows(n: int, columns: Sequence[tuple[str, Any]]) -> bytes:
    """``n`` rows in the format of ``COPY … FROM STDIN (FORMAT BINARY)``, header and trailer
    included.

    ``columns``, in the COPY's column order: (numpy big-endian dtype, values) pairs, the dtype
    ``">i4"``, ``">i8"``, ``">f8"`` or ``"u1"`` (a boolean) and the values an array or a scalar
    all rows share, a NaN float going as NULL; or ``("text", (codes, strings))``, row i's
    value being ``strings[codes[i]]``. A row is a field count, then each field's length and
    bytes (length -1 and no bytes for a NULL). Every row is first laid out at the widest
    (a NULL with its 8 bytes, each string padded to the longest), then one boolean mask drops
    the padding: whole columns at a time, however many distinct strings there are.
    """
    layout: list[Any] = [("nf", ">i2")]
    fill: dict[str, Any] = {"nf": len(columns)}
    gaps: list[tuple[int, int, Any]] = []  # (first byte, end byte, rows keeping those bytes)
    offset = 2
    for j, (dtype, values) in enumerate(columns):
        if dtype == "text":
            codes, strings = values
            encoded = [s.encode() for s in strings]
            widest = max(map(len, encoded), default=0)
            table = np.zeros((len(encoded), 4 + widest), dtype=np.uint8)
            for i, e in enumerate(encoded):
                table[i, :4] = np.frombuffer(struct.pack(">i", len(e)), np.uint8)
                table[i, 4 : 4 + len(e)] = np.frombuffer(e, np.uint8)
            layout.append((f"t{j}", np.uint8, (4 + widest,)))
            fill[f"t{j}"] = table[codes]
            sizes = np.array([len(e) for e in encoded], dtype=np.int64)[codes]
            for pad in range(widest):  # the string's byte `pad` is there when it is that long
                gaps.append((offset + 4 + pad, offset + 5 + pad, sizes > pad))
            offset += 4 + widest
            continue
        size = np.dtype(dtype).itemsize
        layout += [(f"l{j}", ">i4"), (f"v{j}", dtype)]
        fill[f"v{j}"] = values
        null = np.isnan(values) if dtype == ">f8" and np.ndim(values) else None
        if null is not None and null.any():
            fill[f"l{j}"] = np.where(null, -1, size)
            gaps.append((offset + 4, offset + 4 + size, ~null))
        else:
            fill[f"l{j}"] = size
        offset += 4 + size
    rows = np.empty(n, dtype=layout)
    for name, values in fill.items():
        rows[name] = values
    data = rows.view(np.uint8).reshape(n, offset)
    if not gaps:
        return COPY_HEADER + data.tobytes() + COPY_TRAILER
    keep = np.ones((n, offset), dtype=bool)
    for start, end, present in gaps:
        keep[:, start:end] = present[:, None]
    return COPY_HEADER + data[keep].tobytes() + COPY_TRAILER
