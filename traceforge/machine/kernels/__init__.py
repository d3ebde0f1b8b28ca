"""Measured kernel times: a table (kind, shape, dtype -> µs) or a PyTorch profiler (Kineto) trace
of one real step, read into one mapping the compute model consults per kernel (docs/kernel-times.md).
"""
