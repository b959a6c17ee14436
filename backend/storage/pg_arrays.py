"""One-dimensional PostgreSQL arrays pre-encoded in binary wire format, and their psycopg dumpers.

psycopg dumps a Python list element by element in Python (about 1 µs per element); numpy writes
the same bytes for a whole column at once. The PostgreSQL storage strategy
(``backend.storage.postgresql``) sends every bulk-written column this way, on connections it
has ``register``-ed the dumpers on.
"""

from __future__ import annotations

import struct
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
