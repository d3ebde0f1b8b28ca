"""matrix_*.csv: the fast writer gives the bytes csv.writer gives, cell by cell, for any values."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from traceforge.traffic.matrix import write_matrix_csv


def _by_csv_writer(matrix, path, label):
    def number(value: float):
        return int(value) if float(value).is_integer() else round(float(value), 3)

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"{label} (src \\ dst)"] + list(range(matrix.shape[1])))
        for i, row in enumerate(matrix):
            w.writerow([i] + [number(v) for v in row])


@pytest.mark.parametrize("n", [0, 1, 4, 33])
def test_matrix_csv_bytes_equal_csv_writer(tmp_path, n):
    rng = np.random.default_rng(n)
    values = [0.0, -0.0, 1.5, 2.0, 1e20, 1 / 3, np.nan, np.inf, 123456789.123456, 7.0005, 2.0**60]
    matrix = rng.choice(values, size=(n, n))
    _by_csv_writer(matrix, tmp_path / "want.csv", "rank")
    write_matrix_csv(matrix, tmp_path / "got.csv", "rank")
    assert (tmp_path / "got.csv").read_bytes() == (tmp_path / "want.csv").read_bytes()
