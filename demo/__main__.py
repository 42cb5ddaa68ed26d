"""The demo target's build process: ``python -m demo OUT SIZE SEED [PRECISION]`` (`demo.target._spawn_build` runs it in
a fresh interpreter; call `demo.ensure_demo_target` instead)."""

import sys

from demo.target import _build_target

if __name__ == "__main__":
    out, size, seed, *precision = sys.argv[1:]
    _build_target(out, size, int(seed), *precision)  # type: ignore[arg-type]
