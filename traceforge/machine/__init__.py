"""The machine: the GPU table, the cluster and its links, NCCL's cost model, collective
arithmetic, ASTRA-sim's network view, measured kernel-time files."""
