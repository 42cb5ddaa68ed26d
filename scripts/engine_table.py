"""Write the engine-support table (results/engine-support/) from the results tests/test_engines.py computed.

    python -m pytest tests/test_engines.py        # slow: each export loaded by the engines' own code
    python scripts/engine_table.py --results /tmp/pytest-of-$USER/pytest-N/engines0/results.json

tests/test_engines.py writes its results only to its temporary directory (``results.json`` there: one
row per case of ``tests/engines/cases.py``, with the verdict text the table shows) and fails, naming that
file, when the committed table differs from what this script would write from it. This script then writes
``results/engine-support/results.json`` (those results) and ``table.md`` (the README quotes it between
its ``engine-support table`` markers). `render` is what both the script and the tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "engines"))  # the case list the tests run
from cases import CASES, RESULTS, TABLE  # noqa: E402

sys.path.insert(0, ROOT)
from heads import registry  # noqa: E402

# a case's heads column: its head type's registry title, or for a variant of the head type (the case's
# ``method``) that title formatted into the variant's label
VARIANTS = {
    "medusaown": "{} (own lm_heads)",
    "eaglebias": "{} (fc bias)",
    "eagle3full": "{} (full vocab)",
    "eagle31": "{}.1",  # EAGLE-3.1
}
HEADER = ["| heads | draft layer | target | `--to` | engine | result |", "|---|---|---|---|---|---|"]


def table_rows(results: dict[str, dict]) -> dict[str, str]:
    """Case id -> its table line, for the cases ``results`` holds (each row carries its ``verdict``)."""
    lines = {}
    for cid, head, layer, arch, to, engine, method in CASES:
        if cid not in results:
            continue
        eng = {"sglang": "sglang-0.5.23", "vllm": "vllm-0.33.0"}[to] if engine is None else engine
        eng = eng.replace("vllm-", "vLLM ").replace("sglang-", "SGLang ")
        text = results[cid]["verdict"].replace("|", "/")
        title = VARIANTS.get(head, "{}").format(registry.get(method).title)
        lines[cid] = f"| {title} | {layer} | {arch} | `{to}` | {eng} | {text} |"
    return lines


def render(doc: dict) -> str:
    """table.md for a results document ``{"engines": ..., "results": {case id: row}}`` of every case."""
    missing = [c[0] for c in CASES if c[0] not in doc["results"]]
    if missing:
        raise ValueError(
            f"no results for {len(missing)} cases ({', '.join(missing[:3])}, ...): run every case"
        )
    rows = table_rows(doc["results"])
    return "\n".join(HEADER + [rows[c[0]] for c in CASES]) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--results", required=True, help="the results.json tests/test_engines.py wrote (its tmp dir)"
    )
    args = p.parse_args(argv)
    with open(args.results) as f:
        doc = json.load(f)
    table = render(doc)  # checks that every case is there before anything is written
    text = json.dumps(doc, indent=1, sort_keys=True)
    for rel, content in ((RESULTS, text), (TABLE, table)):
        path = os.path.join(ROOT, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(content)
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
