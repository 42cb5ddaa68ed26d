"""Build (or find) the demo target and its head-training data, and print where they are.

    python scripts/make_demo_target.py                  # the 12-layer target, ~10 min on 2 CPU cores
    python scripts/make_demo_target.py --size tiny      # the 2-layer test target, seconds
    python scripts/make_demo_target.py --force --cache /tmp/selfspec

Both are cached (``$SELFSPEC_CACHE`` or ``~/.cache/selfspec`` unless ``--cache``); a second run only
prints. A thin command line over `demo.make` (the demo package: docs/design.md §10).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from demo.make import MakeDemoOptions, make  # noqa: E402  (after the offline default: read at import)
from heads.config import parse_cli  # noqa: E402

if __name__ == "__main__":
    make(parse_cli(MakeDemoOptions, prog="scripts/make_demo_target.py"))
