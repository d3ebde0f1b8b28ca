"""The parallel layout: ranks and their groups, the pipeline's partition of the model and its
schedules."""
