"""traceforge: per-GPU Chakra execution traces of 3D-parallel LLM training."""

__version__ = "0.1.0"
