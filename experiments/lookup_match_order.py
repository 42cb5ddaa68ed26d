"""How often is prompt lookup's chain right, by the length of the suffix it matched? Replays
`infer.lookup.NgramIndex` over chat rows with no model: at every position of each answer (the index
holding the chat-templated prompt and the answer so far) it takes the chain the index proposes, as
`infer.generate` would, and records the matched suffix length n (3, 2 or 1 tokens), whether the chain's
first token is the answer's next one, and how many of its first ``--k`` tokens are right in a row.

    python experiments/lookup_match_order.py --data out/smollm2/train.jsonl \\
        --tokenizer ~/.cache/selfspec/targets/gguf-<hash> --rows 150 --out results/smollm2-chain-price/match-order.md

The rows should be the target's own answers (self-distilled data), since that is what it writes at
inference. Every ``len(rows) // --rows``-th row is read (an even spread over the file).
"""

import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # experiments/ sits beside the packages

from transformers import AutoTokenizer  # noqa: E402

from bench.report import write_text  # noqa: E402
from infer.lookup import NgramIndex  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="JSONL of chat rows ({'messages': [user, assistant, ...]})")
    ap.add_argument("--tokenizer", required=True, help="the target's tokenizer directory")
    ap.add_argument("--rows", type=int, default=150, help="rows to read, evenly spread")
    ap.add_argument("--k", type=int, default=8, help="chain length")
    ap.add_argument("--out", help="write the table here (Markdown)")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    with open(args.data) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = rows[:: max(len(rows) // args.rows, 1)][: args.rows]
    stats = defaultdict(lambda: [0, 0, 0])  # n -> [chains, first token right, Σ right in a row]
    positions = 0
    for row in rows:
        msgs = row["messages"]
        prompt = tok.apply_chat_template(msgs[:1], add_generation_prompt=True, tokenize=False)
        answer = tok(msgs[1]["content"], add_special_tokens=False)["input_ids"]
        index = NgramIndex(tok(prompt, add_special_tokens=False)["input_ids"])
        for i, t in enumerate(answer):
            n, chain = index.find(args.k)
            positions += 1
            if chain:
                right = 0
                while right < len(chain) and i + right < len(answer) and chain[right] == answer[i + right]:
                    right += 1
                s = stats[n]
                s[0], s[1], s[2] = s[0] + 1, s[1] + (right > 0), s[2] + right
            index.extend([t])
    lines = [
        f"Prompt lookup's chains (k = {args.k}) over {len(rows)} rows of `{args.data}`, {positions} answer "
        "positions.",
        "",
        "| matched suffix | chains | share of positions | first token right | right tokens in a row (mean) |",
        "|---|---|---|---|---|",
    ]
    for n in sorted(stats, reverse=True):
        c, first, run = stats[n]
        lines.append(f"| {n} tokens | {c} | {c / positions:.0%} | {first / c:.1%} | {run / c:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        write_text(args.out, text)


if __name__ == "__main__":
    main()
