"""Issue 16: a better-trained demo target, to test whether the ceiling measured in ../eagle3-ablation/
(every head within a few percent of the best tree's τ at T=0.7, greedy at the depth-6 cap) is what hides
EAGLE-3 > EAGLE-1. Same shape, corpus, tokenizer and optimiser as the demo's "full" target (recipe 2),
trained on 3x the tokens: 1200 steps x 16 x 256 (about 2 epochs of the 9208 train windows).

    PYTHONPATH=$PWD python results/better-target/build_target.py out/bt/target

Writes the model, tokenizer and demo_info.json (held-out loss) into the given directory.
"""

import dataclasses
import sys

from demo import spec as demo_spec
from demo import target as demo_target

out = sys.argv[1]
base = demo_spec.SPECS["full"]
demo_spec.SPECS["full"] = dataclasses.replace(base, steps=3 * base.steps, warmup_steps=3 * base.warmup_steps)
demo_target._build_target(out, "full", seed=0)
