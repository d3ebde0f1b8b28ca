"""The few pieces of the protobuf wire format the splicing encoder needs.

Field order and presence follow what protobuf's own serializer emits for proto3 (fields in
number order, zero scalars omitted, a set oneof member always written, repeated scalars
packed), so our bytes equal SerializeToString(deterministic=True); tests hold us to that.
"""

from __future__ import annotations

VARINT, LEN = 0, 2


def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives are ten-byte two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(field_number: int, wire_type: int) -> bytes:
    return varint((field_number << 3) | wire_type)


def length_delimited(field_number: int, payload: bytes) -> bytes:
    return key(field_number, LEN) + varint(len(payload)) + payload


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode a varint at pos; return (value, next pos). Raises ValueError when cut short."""
    result = shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise ValueError("varint longer than 10 bytes")
