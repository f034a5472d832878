"""Column names from a parquet file's footer, without pyarrow: the laptop has no heavy dependencies.

A parquet file ends with its metadata (Thrift compact protocol), its length (4 bytes, little endian)
and "PAR1". ``parquet_columns`` reads the tail through a ``read_range`` callable (an HTTP range
request on the Hub) and walks only ``FileMetaData.schema`` for the top-level column names. It never
reads row data and raises ``ParquetError`` for anything it does not understand.
"""

from __future__ import annotations

import struct

TAIL_BYTES = 64 * 1024


class ParquetError(ValueError):
    pass


def parquet_columns(read_range, size: int) -> list[str]:
    """Top-level column names from a parquet file's footer (the Thrift FileMetaData schema).

    ``read_range(start, end)`` returns bytes start..end inclusive. Reads the last 64 KiB, more only
    for a larger footer."""
    if size < 12:
        raise ParquetError("too small to be parquet")
    start = max(0, size - TAIL_BYTES)
    tail = read_range(start, size - 1)
    if tail[-4:] != b"PAR1":
        raise ParquetError("no parquet magic")
    (meta_len,) = struct.unpack("<i", tail[-8:-4])
    if meta_len + 8 > len(tail):
        tail = read_range(size - 8 - meta_len, size - 1)
    meta = tail[len(tail) - 8 - meta_len : len(tail) - 8]
    schema = _Thrift(meta).file_schema()
    if not schema:
        raise ParquetError("empty schema")
    names, i = [], 1
    for _ in range(schema[0][1]):  # the root's children are the top-level columns
        names.append(schema[i][0])
        i = _skip_subtree(schema, i)
    return names


def _skip_subtree(schema, i: int) -> int:
    children = schema[i][1]
    i += 1
    for _ in range(children):
        i = _skip_subtree(schema, i)
    return i


class _Thrift:
    """Just enough of Thrift's compact protocol to read FileMetaData.schema: [(name, num_children)]."""

    def __init__(self, data: bytes):
        self.d, self.i = data, 0

    def _byte(self) -> int:
        if self.i >= len(self.d):
            raise ParquetError("footer cut short")
        b = self.d[self.i]
        self.i += 1
        return b

    def _varint(self) -> int:
        shift = result = 0
        while True:
            b = self._byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def _zigzag(self) -> int:
        n = self._varint()
        return (n >> 1) ^ -(n & 1)

    def _fields(self):
        """Yield (field id, type) of a struct until STOP."""
        last = 0
        while True:
            b = self._byte()
            ftype = b & 0x0F
            if ftype == 0:
                return
            delta = b >> 4
            last = last + delta if delta else self._zigzag()
            yield last, ftype

    def _skip(self, ftype: int) -> None:
        if ftype in (1, 2):
            return
        if ftype == 3:
            self.i += 1
        elif ftype in (4, 5, 6):
            self._varint()
        elif ftype == 7:
            self.i += 8
        elif ftype == 8:
            self.i += self._varint()
        elif ftype in (9, 10):
            size, etype = self._list_header()
            for _ in range(size):
                self._skip_elem(etype)
        elif ftype == 11:
            size = self._varint()
            if size:
                kv = self._byte()
                for _ in range(size):
                    self._skip_elem(kv >> 4)
                    self._skip_elem(kv & 0x0F)
        elif ftype == 12:
            for _, t in self._fields():
                self._skip(t)
        else:
            raise ParquetError(f"unknown thrift type {ftype}")

    def _skip_elem(self, etype: int) -> None:
        if etype in (1, 2):  # booleans inside containers take a byte
            self.i += 1
        else:
            self._skip(etype)

    def _list_header(self) -> tuple[int, int]:
        b = self._byte()
        size = b >> 4
        if size == 15:
            size = self._varint()
        return size, b & 0x0F

    def file_schema(self) -> list[tuple[str, int]]:
        for fid, ftype in self._fields():
            if fid == 2 and ftype == 9:
                size, _ = self._list_header()
                return [self._schema_element() for _ in range(size)]
            self._skip(ftype)
        return []

    def _schema_element(self) -> tuple[str, int]:
        name, children = "", 0
        for fid, ftype in self._fields():
            if fid == 4 and ftype == 8:
                n = self._varint()
                name = self.d[self.i : self.i + n].decode("utf-8", "replace")
                self.i += n
            elif fid == 5 and ftype == 5:
                children = self._zigzag()
            else:
                self._skip(ftype)
        return name, children
