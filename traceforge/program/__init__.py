"""The programs traceforge plans: per pipeline stage, a rank-independent program of ops that speak
in roles (ops.py), built from the schedule, the layers and the end-of-step traffic (stage.py)."""
