"""The Chakra ET format: the protobuf bindings, the attribute contract (schema.py), the wire
primitives, framing and decoding of rank files, and the rank-file shapes the readers reuse."""
