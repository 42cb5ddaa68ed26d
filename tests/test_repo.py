"""The README's set-up commands are what CI runs, and the light packages stay light."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_commands() -> list[str]:
    text = open(os.path.join(ROOT, "README.md")).read()
    setup = text.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)


def test_readme_has_exactly_two_setup_commands():
    cmds = readme_commands()
    assert len(cmds) == 2, cmds
    assert all("\n" not in c for c in cmds), "each set-up command is one line a newcomer pastes"
    demo, tests = cmds
    for c in cmds:  # torch first, pinned: an open range pulls a CUDA build on CPU machines
        assert c.index("pip install torch==2.13.0") < c.index("pip install -e")
    # issue 17: the first command trains the recommended way (self-distilled data) and shows the comparison
    assert (
        demo.index("scripts/regenerate_data.py --target demo")
        < demo.index("train/train_heads.py --config configs/demo-medusa-regen.yaml")
        < demo.index("scripts/demo_generate.py --heads out/demo-medusa-regen")
    )
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    test_cmd = readme_commands()[1]
    assert test_cmd.replace("pip install ", "pip install -q ") in ci or test_cmd in ci


def test_infer_and_heads_import_light():
    code = "import sys, infer, heads; print(any(m in sys.modules for m in ('deepspeed', 'wandb')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
