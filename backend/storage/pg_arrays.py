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


_ELEMENT_OIDS = {">i4": 23, ">i8": 20, ">f8": 701, "u1": 16}  # int4, int8, float8, bool


def copy_array_rows(
    bounds: Any, fields: Sequence[tuple[str, Any]], arrays: Sequence[tuple[str, Any]]
) -> bytes:
    """Rows of ``COPY … FROM STDIN (FORMAT BINARY)`` (header and trailer included) that end in
    one-dimensional arrays.

    Row j is ``fields`` (fixed-width, never NULL: (numpy big-endian dtype, one value per row or
    a scalar all rows share)), then one array per ``arrays`` entry ((element dtype, every row's
    elements one after another)) holding elements ``bounds[j]`` to ``bounds[j + 1] - 1``; a
    NaN float element is a NULL element. An array field is its length, a 20-byte header (one
    dimension, a has-NULL flag, the element type, the length, lower bound 1), then each
    element's length and bytes (-1 and none for a NULL). Built a column at a time: the fixed
    parts as one record per row, the elements as one record per element, then every piece
    scattered into place with one index array.
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    n = len(bounds) - 1
    if n == 0:
        return COPY_HEADER + COPY_TRAILER
    counts = np.diff(bounds)
    layout: list[Any] = [("nf", ">i2")]
    for j, (dtype, _) in enumerate(fields):
        layout += [(f"l{j}", ">i4"), (f"v{j}", dtype)]
    lead = np.empty(n, dtype=layout)
    lead["nf"] = len(fields) + len(arrays)
    for j, (dtype, values) in enumerate(fields):
        lead[f"l{j}"] = np.dtype(dtype).itemsize
        lead[f"v{j}"] = values
    # Each piece: the bytes it adds to every row, one row after another, and each row's count.
    pieces: list[tuple[Any, Any]] = [(lead.view(np.uint8), np.full(n, lead.itemsize))]
    for dtype, values in arrays:
        size = np.dtype(dtype).itemsize
        null = np.isnan(values) if dtype == ">f8" else np.zeros(len(values), dtype=bool)
        elems = np.empty(len(values), dtype=[("len", ">i4"), ("v", dtype)])
        elems["len"] = np.where(null, -1, size)
        elems["v"] = values
        data = elems.view(np.uint8).reshape(len(values), 4 + size)
        if null.any():
            keep = np.ones(data.shape, dtype=bool)
            keep[:, 4:] = ~null[:, None]
            body = data[keep]
        else:
            body = data.reshape(-1)
        ends = np.concatenate([[0], np.cumsum(np.where(null, 4, 4 + size))])
        body_bytes = ends[bounds[1:]] - ends[bounds[:-1]]
        has_null = np.diff(np.concatenate([[0], np.cumsum(null)])[bounds]) > 0
        head = np.empty(n, dtype=[(f, ">i4") for f in ("len", "ndim", "flags", "oid", "dim", "lb")])
        head["len"], head["ndim"], head["flags"] = 20 + body_bytes, 1, has_null
        head["oid"], head["dim"], head["lb"] = _ELEMENT_OIDS[dtype], counts, 1
        pieces += [(head.view(np.uint8), np.full(n, head.itemsize)), (body, body_bytes)]
    row_bytes = np.sum([sizes for _, sizes in pieces], axis=0, dtype=np.int64)
    at = np.concatenate([[0], np.cumsum(row_bytes)[:-1]]).astype(np.int64)  # each row's start
    out = np.empty(int(row_bytes.sum()), dtype=np.uint8)
    for data, sizes in pieces:
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        out[np.repeat(at - starts, sizes) + np.arange(len(data))] = data
        at = at + sizes
    return COPY_HEADER + out.tobytes() + COPY_TRAILER
