"""`traceforge plan`'s answers: one search, a sweep, shards and their merge, as rows, JSON,
CSV, plots and the written top sets."""
