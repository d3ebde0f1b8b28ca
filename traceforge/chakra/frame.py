"""Framing: the one place that turns a rank file into its messages, for every reader.

A Chakra ET file is a sequence of messages, each a varint length and that many bytes: first a
GlobalMetadata, then Nodes. check, report, diff, show and export all frame through here, so
they refuse the same inputs in the same words:
- only regular files are read (a FIFO would block forever, a device never end), once, bounded
  by the size the file has when opened;
- a length prefix is compared with the bytes left before anything is sliced, so a corrupt
  prefix never makes us allocate what it claims.
Each failure is a FrameError with a kind (the `check` finding it becomes) and the byte offset.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from traceforge.base.errors import TraceReadError
from traceforge.base.files import MAX_RANK_FILE_BYTES
from traceforge.chakra.wire import read_varint

MISSING, UNREADABLE, EMPTY, TRUNCATED, CORRUPT = "missing-rank", "unreadable", "empty", "truncated", "corrupt"


class FrameError(TraceReadError):
    """A rank file that cannot be framed; `kind` names the failure, `detail` says it without the path."""

    def __init__(self, kind: str, path: object, detail: str):
        super().__init__(f"{path}: {detail}")
        self.kind, self.path, self.detail = kind, path, detail

    def __reduce__(self):  # crosses process boundaries from reading workers
        return FrameError, (self.kind, self.path, self.detail)


def read_file(path: Path | str) -> bytes:
    """The whole file, if it is a regular, non-empty file; else a FrameError."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise FrameError(MISSING, path, "no such file") from None
    except OSError as exc:
        raise FrameError(UNREADABLE, path, f"cannot read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FrameError(UNREADABLE, path, "not a regular file (a FIFO, device or directory); "
                                               "give the trace file itself")
        size = info.st_size
        if size > MAX_RANK_FILE_BYTES:  # a sparse or foreign file: never read what cannot be a trace
            raise FrameError(UNREADABLE, path, f"{size:,} bytes, more than the {MAX_RANK_FILE_BYTES:,} a Chakra ET "
                                               "file can hold; give the trace file itself")
        if size == 0:
            raise FrameError(EMPTY, path, "empty file (0 bytes); a Chakra ET file holds a GlobalMetadata and nodes")
        chunks, left = [], size
        while left:
            chunk = os.read(fd, min(left, 1 << 26))
            if not chunk:  # shrank while read: what is there is framed (and found truncated)
                break
            chunks.append(chunk)
            left -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except OSError as exc:
        raise FrameError(UNREADABLE, path, f"cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)


def frames(data: bytes, name: object = "trace") -> Iterator[tuple[int, bytes]]:
    """(offset of its length prefix, payload) of each message in data, in order."""
    offsets: list[int] = []
    payloads = split(data, name, offsets)
    return zip(offsets, payloads, strict=True)


def split(data: bytes, name: object = "trace", offsets: list[int] | None = None) -> list[bytes]:
    """The payload of each message in data, in order (and the offset of each length prefix
    appended to offsets, when given); the whole file is framed before anything is decoded."""
    payloads: list[bytes] = []
    append = payloads.append
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        size = data[pos]
        if size < 0x80:  # one-byte prefix: most nodes
            pos += 1
        elif pos + 1 < end and data[pos + 1] < 0x80:  # two bytes: the rest of ours
            size = (size & 0x7F) | (data[pos + 1] << 7)
            pos += 2
        else:
            try:
                size, pos = read_varint(data, pos)
            except ValueError as exc:
                kind = TRUNCATED if "truncated" in str(exc) else CORRUPT
                raise FrameError(kind, name, f"bad length prefix at byte {start:,} ({exc}); "
                                             "the file is corrupt or truncated") from None
        if size > end - pos:
            raise FrameError(TRUNCATED, name, f"the message at byte {start:,} needs {size:,} bytes but only "
                                              f"{end - pos:,} remain; the file is truncated")
        if offsets is not None:
            offsets.append(start)
        append(data[pos:pos + size])
        pos += size
    return payloads


def payload_at(path: Path | str, offset: int) -> bytes | None:
    """The payload of the message whose length prefix sits at offset, read alone (None when
    the file or the message there is not readable)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not 0 <= offset < info.st_size:
            return None
        os.lseek(fd, offset, os.SEEK_SET)
        size, start = read_varint(os.read(fd, 10), 0)
        if size > info.st_size - offset - start:
            return None
        os.lseek(fd, offset + start, os.SEEK_SET)
        return os.read(fd, size)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def prefetch(path: Path | str) -> None:
    """Ask the kernel to start reading a file we will read soon (readers that go through many
    files overlap their disk reads with their work); a no-op where that is not supported."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
