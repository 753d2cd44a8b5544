"""Benchmark rows and the summary table, end to end on a tiny model."""
from core.benchmark import row_for, table
from core.config import DecodeConfig
from core.engine import run
from tests.conftest import tiny_pair


def test_rows_and_table_on_a_tiny_model():
    pair = tiny_pair()
    rows = []
    for i, prompt in enumerate([[0, 5, 6, 7], [0, 9, 3]]):
        ar = row_for("toy", i, DecodeConfig(method="ar", max_new_tokens=20), run(pair, prompt, DecodeConfig(
            method="ar", max_new_tokens=20)), None)
        rows.append(ar)
        for budget in (4, 16):
            cfg = DecodeConfig(method="ddtree", budget=budget, max_new_tokens=20)
            rows.append(row_for("toy", i, cfg, run(pair, prompt, cfg), ar["tpot"]))
    assert all(r["speedup"] > 0 for r in rows if r["method"] != "ar")
    text = table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + 3 and lines[2].startswith("| toy | ar |")
    assert all(line.endswith("| 2/2 |") for line in lines[2:])       # lossless: every output equals plain
