"""Store the project's prediction beside each published engine log line in benchmarks/data/engine-logs.json.

    .venv/bin/python benchmarks/engine_logs.py   # then benchmarks/doc_tables.py renders docs/engine_logs.md

Each row's facts (URL, model, settings, the engine's line and number) are typed from its public source; this
script adds `predicted` (the number as the engine would print it), `low`/`high` (vLLM: the ends of the printed
memory's 0.01 GiB rounding) and `relation` from dantinox.accounting.engine_logs.predict. The test
tests/test_engine_logs.py recomputes them, so a stored prediction that drifts from the rules fails.
"""

from __future__ import annotations

import json
from pathlib import Path

from dantinox.accounting.engine_logs import predict

DATA = Path(__file__).resolve().parent / "data" / "engine-logs.json"


def refresh(data: dict) -> dict:
    rows = []
    for i, row in enumerate(data["rows"]):
        p = predict(row, f"{DATA.name}: rows[{i}]")
        rows.append({**row, "predicted": p.shown, "low": p.low, "high": p.high, "relation": p.relation})
    return {**data, "rows": rows}


def main() -> None:
    data = refresh(json.loads(DATA.read_text()))
    DATA.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    for row in data["rows"]:
        print(f"{row['engine']:9} {row['model']:22} {row['line'][:60]:60} -> {row['predicted']:>10} "
              f"({row['relation']})")


if __name__ == "__main__":
    main()
