"""The model: each layer's anatomy, parameter counts, FLOPs, kept activations and the compute
cost of every kernel it runs."""
