"""Push a saved heads directory to the Hugging Face Hub (`heads.hub.push_command`).

    python scripts/push_heads.py push out/demo-medusa your-name/demo-medusa [--public] [--revision BR]

Uploads an allow-list of the heads' files (printed first); the repo is created private unless --public.
"""

from __future__ import annotations

from heads.config import parse_cli
from heads.hub import PushOptions, push_command


def main(argv: list[str] | None = None) -> None:
    print(push_command(parse_cli(PushOptions, argv, prog="python scripts/push_heads.py")))


if __name__ == "__main__":
    main()
