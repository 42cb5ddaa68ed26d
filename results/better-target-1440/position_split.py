"""Drafts accepted per context, split into the first position of the continuation (right after the prompt;
for a chat prompt, right after the template's assistant header) and the later ones, from tree_ceiling.py's
results.json (``raw[setting]["values"][head]``: [prompts][contexts] drafts accepted, context 0 at the first
new token). τ = 1 + drafts accepted.

    python results/better-target-1440/position_split.py results/better-target-1440/ceiling-greedy [...]
"""

import json
import sys

for d in sys.argv[1:]:
    raw = json.load(open(f"{d}/results.json"))["raw"]
    print(f"\n{d}\n\n| setting | head | first position | later positions | later, minus the first head's |")
    print("|---|---|---|---|---|")
    for setting, r in raw.items():
        base = None
        for head, rows in r["values"].items():
            first = sum(p[0] for p in rows) / len(rows)
            later = [x for p in rows for x in p[1:]]
            mean = sum(later) / len(later)
            base = mean if base is None else base
            print(f"| {setting} | {head} | {first:.2f} | {mean:.3f} | {mean - base:+.3f} |")
