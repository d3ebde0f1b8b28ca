"""What a trace set puts on the network: per-dimension traffic, traffic matrices, the
collective test matrix, expert links."""
