"""Every command the README and docs/ show parses as written: the script exists, and its flags, config file
and ``key=value`` overrides are accepted by the script's own parser and the project's config loader.

Nothing runs: a ``scripts/*.py`` command is executed up to its `heads.config.parse_cli` call (every script
parses its options there), which parses the given argv, loads ``--config`` and applies the overrides, and
is then stopped. An ``experiments/*.py`` command (the measurement drivers that docs/experiments.md cites;
their commands stand in the results/ folders' READMEs) is executed up to its argparse ``parse_args``. A training command (``python train/train_heads.py``, ``accelerate launch ...`` or
``python -m train.launch ...``) has its launcher arguments parsed by accelerate's own launch parser, then
the script's by `train.train_heads.parse_args`, and its config loaded with `train.config.load_config`,
which refuses unknown keys and bad values. The README's two set-up commands are CI's own (tests/test_repo.py).
The README's Llama-3.1-8B commands, serving included, are configs/llama-3.1-8b-eagle3.yaml's header, which
tests/test_recipes.py parses and runs through the engines.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import runpy
import shlex
import sys

import pytest

import heads.config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
PYTHON = {"python", "python3"}
TRAIN = "train/train_heads.py"


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def setup_commands() -> set[str]:
    setup = _read("README.md").split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S))


def split_commands(block: str) -> list[list[str]]:
    """A bash block -> argv lists: continuations joined, comments dropped, split at ``&&``, ``;`` and ``|``,
    leading ``VAR=value`` assignments removed."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        argv: list[str] = []
        for tok in shlex.split(line, comments=True) + ["&&"]:
            if tok in ("&&", ";", "|", "||"):
                while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
                    argv.pop(0)
                if argv:
                    out.append(argv)
                argv = []
            else:
                argv.append(tok)
    return out


def documented_commands() -> list[tuple[str, list[str]]]:
    skip = setup_commands()
    found = []
    for rel in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", _read(rel), flags=re.S):
            if block.strip() in skip:
                continue
            for argv in split_commands(block):
                found.append((rel, argv))
    return found


def checked(argv: list[str]) -> bool:
    """The commands this test understands: this project's scripts and its training launchers."""
    if argv[0] in PYTHON and len(argv) > 1:
        return argv[1].endswith(".py") or argv[1:3] == ["-m", "train.launch"]
    return argv[:2] == ["accelerate", "launch"]


COMMANDS = [(rel, argv) for rel, argv in documented_commands() if checked(argv)]


def _config_exists(args: list[str]) -> None:
    """``--config FILE``: the file exists."""
    for i, tok in enumerate(args[:-1]):
        if tok == "--config":
            path = args[i + 1]
            if not os.path.exists(os.path.join(ROOT, path)):
                pytest.fail(f"config file {path} does not exist")


class _Parsed(Exception):
    """Raised by the stand-in for `heads.config.parse_cli` once the script's options are parsed."""


def _run_until_parsed(script: str, args: list[str], capsys, parser: str) -> object:
    """Run ``script`` as ``__main__`` with ``args`` until its ``parser`` (already swapped for one that
    raises `_Parsed`) has parsed them; return what it parsed."""
    argv, path = sys.argv, list(sys.path)
    try:
        sys.argv = [script, *args]
        runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    except _Parsed as done:
        return done.args[0]
    except SystemExit as e:
        pytest.fail(f"{script} {shlex.join(args)}: exit {e.code}: {capsys.readouterr().err.strip()}")
    finally:
        sys.argv, sys.path[:] = argv, path
    pytest.fail(f"{script} ran without parsing its options through {parser}")


def parse_script(script: str, args: list[str], capsys) -> object:
    """Run ``script`` as ``__main__`` up to its `parse_cli` call and return the options it parsed."""
    real = heads.config.parse_cli

    def parse_then_stop(*a, **k):
        raise _Parsed(real(*a, **k))

    bound = [m for m in list(sys.modules.values()) if getattr(m, "parse_cli", None) is real]
    try:
        for m in bound:
            m.parse_cli = parse_then_stop
        return _run_until_parsed(script, args, capsys, "heads.config.parse_cli")
    finally:
        for m in bound:
            m.parse_cli = real


def parse_experiment(script: str, args: list[str], capsys, monkeypatch) -> argparse.Namespace:
    """Run an ``experiments/`` driver as ``__main__`` up to its argparse ``parse_args`` call and return the
    namespace it parsed (the drivers are plain argparse command lines)."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *a, **k):
        raise _Parsed(real(self, *a, **k))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    return _run_until_parsed(script, args, capsys, "argparse")


def parse_training(args: list[str], capsys) -> None:
    """train/train_heads.py's own argv parser, then the project's config loader (keys and values)."""
    from train.config import load_config
    from train.train_heads import parse_args

    _config_exists(args)
    try:
        a = parse_args(args)
    except SystemExit as e:
        pytest.fail(f"{TRAIN} {shlex.join(args)}: exit {e.code}: {capsys.readouterr().err.strip()}")
    load_config(
        os.path.join(ROOT, a.config) if a.config else None, [*a.overrides, *(["resume=auto"] * a.resume)]
    )


def parse_launch(args: list[str], capsys) -> None:
    """``accelerate launch ARGS`` / ``python -m train.launch ARGS``: accelerate's own launch parser, then the
    training script's arguments."""
    from accelerate.commands.launch import launch_command_parser

    try:
        ns = launch_command_parser().parse_args(args)
    except SystemExit as e:
        pytest.fail(f"accelerate launch {shlex.join(args)}: exit {e.code}: {capsys.readouterr().err.strip()}")
    if ns.config_file:
        assert os.path.exists(os.path.join(ROOT, ns.config_file)), f"no accelerate config {ns.config_file}"
    assert ns.training_script == TRAIN, f"launches {ns.training_script}, not {TRAIN}"
    parse_training(ns.training_script_args, capsys)


def test_the_docs_show_commands_to_check():
    """The parser finds the commands (guards against a regex that silently matches nothing)."""
    scripts = {argv[1] for _, argv in COMMANDS if argv[0] in PYTHON}
    assert {"scripts/export_heads.py", "scripts/regenerate_data.py", TRAIN} <= scripts, scripts
    assert any(argv[0] == "accelerate" for _, argv in COMMANDS)
    assert len(setup_commands()) == 2


@pytest.mark.parametrize(
    "doc, argv", COMMANDS, ids=[f"{rel}:{i}:{' '.join(argv[:2])}" for i, (rel, argv) in enumerate(COMMANDS)]
)
def test_documented_command_parses(doc, argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands run from the repository root
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if argv[0] == "accelerate":
        return parse_launch(argv[2:], capsys)
    if argv[1:3] == ["-m", "train.launch"]:
        return parse_launch(argv[3:], capsys)
    script, args = argv[1], argv[2:]
    assert os.path.isfile(os.path.join(ROOT, script)), f"{doc}: {script} does not exist"
    if script == TRAIN:
        return parse_training(args, capsys)
    if script.startswith("experiments/"):
        return parse_experiment(script, args, capsys, monkeypatch)
    _config_exists(args)
    parse_script(script, args, capsys)


EXPERIMENTS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "experiments", "*.py")))
RESULTS_READMES = sorted(
    os.path.relpath(p, ROOT)
    for p in glob.glob(os.path.join(ROOT, "results", "**", "README.md"), recursive=True)
)


def experiment_commands() -> list[tuple[str, list[str]]]:
    """Every ``python experiments/NAME.py ARGS`` in the results/ folders' READMEs (indented blocks and inline
    code, continuation lines joined), as argv after ``python``, cut before a ``>`` redirection."""
    found = []
    for rel in RESULTS_READMES:
        text = _read(rel).replace("\\\n", " ")
        for m in re.finditer(r"\bpython3? (experiments/\S+\.py)([^`\n]*)", text):
            args = shlex.split(m.group(2))
            found.append((rel, [m.group(1), *args[: args.index(">") if ">" in args else None]]))
    return found


EXPERIMENT_COMMANDS = experiment_commands()


def test_every_experiment_is_cited_and_has_a_checked_command():
    """experiments/ keeps a driver because docs/experiments.md cites it, and a results/ README gives its
    command (checked below); every experiments/ path the table names exists."""
    table = _read("docs/experiments.md")
    named = set(re.findall(r"experiments/\w+\.py", table))
    assert EXPERIMENTS, "no experiments/*.py found"
    assert named == set(EXPERIMENTS), (
        f"docs/experiments.md names {sorted(named)}, experiments/ has {EXPERIMENTS}"
    )
    commanded = {argv[0] for _, argv in EXPERIMENT_COMMANDS}
    assert commanded == set(EXPERIMENTS), f"results/*/README.md give commands for {sorted(commanded)}"


@pytest.mark.parametrize(
    "readme, argv", EXPERIMENT_COMMANDS, ids=[f"{rel}:{argv[0]}" for rel, argv in EXPERIMENT_COMMANDS]
)
def test_experiment_command_parses(readme, argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert os.path.isfile(os.path.join(ROOT, argv[0])), f"{readme}: {argv[0]} does not exist"
    parse_experiment(argv[0], argv[1:], capsys, monkeypatch)


def test_step_by_step_is_the_first_setup_command():
    """The README's first command on separate lines runs the same commands as the one-line form."""
    text = _read("README.md")
    setup = text.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    one_line = re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)[0]
    steps = text.split("## Quick start, step by step", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", steps, flags=re.S)
    assert split_commands(block) == split_commands(one_line)


def test_vllm_speculative_configs_are_json_with_the_documented_keys():
    """``vllm serve TARGET --speculative-config '{...}'``: vLLM's documented form, a JSON object naming the
    method, the draft and how many tokens it drafts."""
    serves = [argv for _, argv in documented_commands() if argv[:2] == ["vllm", "serve"]]
    assert serves
    for argv in serves:
        assert not argv[2].startswith("-"), f"the target comes first, positional: {argv}"
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec.keys() == {"method", "model", "num_speculative_tokens"}, spec
        assert spec["method"] in {"eagle", "eagle3", "medusa"} and isinstance(
            spec["num_speculative_tokens"], int
        )


def _normalised(argv: list[str]) -> list[str]:
    """argv with a ``--speculative-config`` JSON value in one spelling (key order and spaces aside)."""
    out = list(argv)
    if "--speculative-config" in out:
        i = out.index("--speculative-config") + 1
        out[i] = json.dumps(json.loads(out[i]), sort_keys=True)
    return out


def test_readme_llama_path_is_the_recipe_header():
    """The README's Llama-3.1-8B path (data, training, export, ``vllm serve``, SGLang's launch) is the
    commands of configs/llama-3.1-8b-eagle3.yaml's header, which tests/test_recipes.py parses and runs at
    tiny scale through both engines' own parsers and loaders."""
    from test_recipes import header_commands

    header = [_normalised(c) for c in header_commands("llama-3.1-8b-eagle3")]
    shown = [
        _normalised(argv)
        for rel, argv in documented_commands()
        if rel == "README.md" and any("llama-3.1-8b" in a.lower() for a in argv)
    ]
    assert {a[0] for a in shown} >= {"python", "accelerate", "vllm"}, shown
    assert any(a[1:3] == ["-m", "sglang.launch_server"] for a in shown), shown
    missing = [shlex.join(a) for a in shown if a not in header]
    assert not missing, f"README commands not in the recipe header: {missing}"
