"""The planner: per pipeline stage, a rank-independent program of ops (see ops.py)."""
