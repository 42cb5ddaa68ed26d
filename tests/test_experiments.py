"""The experiment drivers whose committed tables a test can recompute cheaply (no model run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import speed_ceiling  # noqa: E402


@pytest.mark.parametrize("depth", [1, 3, 6])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.99])
def test_chain_alpha_inverts_the_chain_law(depth, alpha):
    tau = sum(alpha**i for i in range(depth + 1))
    assert speed_ceiling.chain_alpha(tau, depth) == pytest.approx(alpha, abs=1e-9)
    assert speed_ceiling.chain_alpha(depth + 1.01, depth) is None


def _profile(rel: str) -> dict:
    with open(os.path.join(ROOT, rel)) as f:
        return json.load(f)["tuning"]["profile"]


def test_committed_ceiling_is_the_scripts_output(tmp_path):
    """results/speed-ceiling/ceiling.md is what experiments/speed_ceiling.py writes from the committed
    inference.json files its README names."""
    inputs = [
        "results/smollm2-eagle31/recipe-1200/inference.json",
        "results/smollm2-first-run/inference.json",
    ]
    subprocess.run([sys.executable, "experiments/speed_ceiling.py", *inputs, "--out", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    with open(os.path.join(ROOT, "results", "speed-ceiling", "ceiling.md")) as f:
        committed = f.read()
    assert (tmp_path / "ceiling.md").read_text() == committed
    # the cost of a row is verify(k + 1 + chain) / verify(1) + draft(D) / verify(1), from the profile
    row = next(r for r in speed_ceiling.rows(_profile(inputs[1]), [2.5], 8) if r["tokens"] == 16
               and r["depth"] == 4)  # fmt: skip
    assert row["cost"] == pytest.approx(1.99, abs=0.005) and row["alpha_needed"]["2.5"] == pytest.approx(
        1.0, abs=0.01
    )
