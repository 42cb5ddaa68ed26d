"""Moved: the demo target is its own package, `demo` (issue 13). This module keeps ``train.demo``
importable for existing callers; new code imports `demo`."""

from demo import *  # noqa: F403, F401
from demo import __all__ as __all__

# The private names other modules and tests used before the move.
from demo.corpus import code_chunks as _code_chunks  # noqa: F401
from demo.corpus import documents as _documents  # noqa: F401
from demo.corpus import read_source as _read  # noqa: F401
from demo.corpus import relpath as _relpath  # noqa: F401
from demo.target import llama_config as _llama_config  # noqa: F401
