"""Build (or find) the demo target and its head-training data and say where they are
(``scripts/make_demo_target.py`` parses `MakeDemoOptions` and calls `make`)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from demo.data import ensure_demo_data
from demo.spec import SPECS
from demo.target import ensure_demo_target


@dataclass
class MakeDemoOptions:
    """Build (or find) the demo target and its head-training data, and print where they are."""

    size: str = field(
        default="full", metadata={"help": "full: 12 layers (~10 min on 2 CPU cores); tiny: 2 layers"}
    )
    seed: int = field(default=0, metadata={"help": "training seed (part of the cache directory name)"})
    cache: str | None = field(
        default=None, metadata={"help": "cache directory (default: $SELFSPEC_CACHE or ~/.cache/selfspec)"}
    )
    force: bool = field(default=False, metadata={"help": "rebuild even if a cached copy exists"})

    def __post_init__(self) -> None:
        if self.size not in SPECS:
            raise ValueError(f"--size must be one of {', '.join(SPECS)}, got {self.size!r}")


def make(o: MakeDemoOptions) -> dict:
    """Build what is missing (or everything, with ``force``), print the paths, row counts and the
    target's demo_info.json; returns ``{"target": dir, "data": {split: path}, "info": {...}}``."""
    t0 = time.perf_counter()
    target = ensure_demo_target(o.size, seed=o.seed, cache=o.cache, force=o.force)  # type: ignore[arg-type]
    data = ensure_demo_data(o.size, seed=o.seed, cache=o.cache, force=o.force)  # type: ignore[arg-type]
    with open(os.path.join(target, "demo_info.json")) as f:
        info = json.load(f)
    info.pop("spec", None)
    print(f"target: {target}")
    for split, path in data.items():
        with open(path) as f:
            rows = sum(1 for _ in f)
        print(f"data {split}: {path} ({rows} rows)")
    print("info: " + json.dumps(info))
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return {"target": target, "data": data, "info": info}
