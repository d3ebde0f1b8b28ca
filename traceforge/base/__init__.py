"""The ground floor: user errors, all-or-nothing output, the process pool, terminal tables and
progress, bounded reading of the files a user names, stated limits. Imports nothing of traceforge."""
