"""Exports loaded by the serving engines' own code (vLLM 0.33 / 0.32, SGLang 0.5.23), on CPU. Slow.

Each engine is installed from its PyPI wheel into a cached venv of its own (`tests/engines/install.py`:
``--no-deps``, the CPU torch build, exact pure-Python dependencies; import-only stand-ins for the
CUDA-only ``torchvision`` and ``sgl_kernel`` under SGLang, none under vLLM). For every pair of
`tests/engines/cases.py`, tiny random heads on a tiny target (Llama, Qwen3, Qwen2, Phi-3, Gemma-2,
Gemma-3; 4 layers) are exported with ``scripts/export_heads.py``'s code and loaded in a subprocess
inside that venv by `tests/engines/vllm_check.py` or `sglang_check.py`: the engine's own argument parser
(the serve flags of the README and docs/serving.md), config parsing, registry, draft construction, ``load_weights`` and
embedding/lm_head sharing. Asserted per pair: every draft parameter loaded (NaN-filled before), no
checkpoint tensor dropped (only ``t2d``, which both engines skip by design, and SGLang's ``d2t``, which
it turns into ``hot_token_id``, checked), the vocab map inside the target vocab, the hidden states the
engine captures equal to the heads' ``aux_layer_ids``, and for EAGLE-1 that the draft computes logits
(vLLM's ``compute_logits`` with the lm_head it shares from the target) and that its ``fc`` on its own
embedding lookup of a few ids equals selfspec's ``fc`` on the target embedding module's output (Gemma's
sqrt(H) folded in by the export). Pairs in ``cases.NOT_SERVED`` must fail in the engine's code with the
error named there. The results (with each row's table verdict) are written only to the test's temporary
directory; ``scripts/engine_table.py`` writes ``results/engine-support/`` from them, and
`test_committed_table_is_the_scripts_output` fails, naming that file, when the committed table differs
(docs/serving.md quotes the table: tests/test_convert.py checks the quote and that table.md is the
script's output for the committed results.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import tiny_model

from heads import Eagle3Head, EagleHead, MedusaHeads, build_vocab_map
from heads.convert import export_heads

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "engines"))
from cases import CASES, NOT_SERVED, TABLE  # noqa: E402
from install import engine_python  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
L, VD = 4, 64
SERVE = {  # the documented serve flags (local paths; SGLang as a chain: topk 1), plus the CPU test's flags
    "vllm": "--model {target} --speculative-config '{spec}' --skip-tokenizer-init --dtype float32 "
    "--max-model-len 64 --enforce-eager",
    "sglang": "--model-path {target} --speculative-algorithm {algo} --speculative-draft-model-path {draft} "
    "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --device cpu "
    "--skip-tokenizer-init --dtype float32",
}


def _randomise(module, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if "norm" in name else 0.0))
    return module


def _heads(head: str, layer: str, target):
    if head.startswith("medusa"):
        lm = "own" if head == "medusaown" else "target"
        return _randomise(MedusaHeads.for_target(target, num_heads=2, num_layers=1, lm_head=lm), 1)
    if head.startswith("eagle") and not head.startswith("eagle3"):
        return _randomise(EagleHead.for_target(target, bias=head == "eaglebias", draft_layer=layer), 2)
    full = head == "eagle3full"
    v31 = {"fc_norm": True, "norm_output": True} if head == "eagle31" else {}  # EAGLE-3.1
    h = Eagle3Head.for_target(target, draft_vocab_size=None if full else VD, aux_layer_ids=[0, 2, 3],
                              draft_layer=layer, **v31)
    _randomise(h, 3)
    if not full:
        counts = torch.randint(0, 50, (target.config.vocab_size,), generator=torch.Generator().manual_seed(4))
        h.set_vocab_map(*build_vocab_map(counts, VD))
    return h


def _fc_check(head, target) -> dict:
    """A few ids and features with selfspec's fc output on them (the target's embedding *module*: Gemma
    scales by sqrt(H)), for the driver to compare with the engine draft's fc on its own embedding lookup."""
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(0, target.config.vocab_size, (5,), generator=g)
    f = torch.randn(5, head.config.hidden_size, generator=g)
    with torch.no_grad():
        want = head.fc(torch.cat([target.get_input_embeddings()(ids), f], dim=-1))
    return {"ids": ids.tolist(), "features": f.tolist(), "expected": want.tolist()}


def _fuse_check(head) -> dict:
    """A few [3H] aux features with selfspec's fused g = ``head.fuse`` on them (EAGLE-3.1: its per-layer
    norms, so the three chunks get different scales), for the vLLM driver's ``combine_hidden_states``."""
    g = torch.Generator().manual_seed(9)
    H = head.config.hidden_size
    aux = torch.randn(5, 3 * H, generator=g) * torch.tensor([1.0, 4.0, 16.0]).repeat_interleave(H)
    with torch.no_grad():
        want = head.fuse(aux)
    return {"aux": aux.tolist(), "expected": want.tolist()}


def serve_args(engine: str, method: str, target: str, draft: str) -> str:
    if engine.startswith("vllm"):
        # Medusa: vLLM builds num_speculative_tokens heads, so it must be the heads' number (2 here)
        spec = json.dumps({"model": draft, "method": method, "num_speculative_tokens": 2 if method == "medusa" else 3})
        return SERVE["vllm"].format(target=target, spec=spec)
    return SERVE["sglang"].format(target=target, draft=draft, algo=method.upper())


def _run_engine(engine: str, cases: list[dict], tmp: str, port: int) -> dict[str, dict]:
    driver = "vllm_check.py" if engine.startswith("vllm") else "sglang_check.py"
    spec, out = os.path.join(tmp, f"{engine}.json"), os.path.join(tmp, f"{engine}-out.json")
    with open(spec, "w") as f:
        json.dump({"port": port, "cases": cases}, f)
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    proc = subprocess.run([engine_python(engine), os.path.join(ROOT, "tests", "engines", driver), spec, out],
                          env=env, capture_output=True, text=True, timeout=900)
    if not os.path.isfile(out):
        raise AssertionError(f"{engine} driver wrote nothing: {proc.stderr[-3000:]}")
    with open(out) as f:
        return {r["id"]: r for r in json.load(f)}


def _selected() -> list[tuple]:
    """The cases to run: all, or (``SELFSPEC_ENGINE_CASES``: comma-separated substrings of case ids, e.g.
    ``eagle31``) those matching; the tests of the others are skipped."""
    only = [w for w in os.environ.get("SELFSPEC_ENGINE_CASES", "").split(",") if w]
    return [c for c in CASES if not only or any(w in c[0] for w in only)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("engines"))
    targets, heads, by_engine, rows = {}, {}, {}, {}
    selected = _selected()
    for cid, head, layer, arch, to, engine, method in selected:
        if arch not in targets:
            m = tiny_model(arch, num_layers=L)
            m.config.architectures = [type(m).__name__]
            if arch == "gemma2":  # as the Hub's Gemma-2 config.json files: SGLang's Gemma2 reads both keys
                m.config.hidden_act = m.config.hidden_activation
            m.save_pretrained(os.path.join(tmp, arch))
            targets[arch] = m
        key = (head, layer, arch)
        if key not in heads:
            heads[key] = _heads(head, layer, targets[arch])
        draft = os.path.join(tmp, cid)
        lm = targets[arch].get_output_embeddings().weight if head.startswith("medusa") else None
        try:
            export_heads(heads[key], draft, to, lm)
        except ValueError as e:
            rows[cid] = {"id": cid, "refused_by_export": str(e)}
            continue
        rows[cid] = {"id": cid, "serve_args": serve_args(engine, method, os.path.join(tmp, arch), draft)}
        case = {"id": cid, "method": method, "serve_args": rows[cid]["serve_args"]}
        if method == "eagle":
            case["fc_check"] = _fc_check(heads[key], targets[arch])
        if method == "eagle3":
            case["fuse_check"] = _fuse_check(heads[key])
        by_engine.setdefault(engine, []).append(case)
    for engine in sorted(by_engine):  # built (or being built) by the background prefetch: wait on each lock here,
        engine_python(engine)  # in the main thread, where Ctrl-C interrupts the wait
    for i, (engine, cases) in enumerate(sorted(by_engine.items())):
        for cid, r in _run_engine(engine, cases, tmp, 29600 + i).items():
            rows[cid].update(r)
    expected = {cid: list(heads[(h, ly, a)].aux_layer_ids) for cid, h, ly, a, *_ in selected if h.startswith("eagle3")}
    path = _write(rows, expected, tmp)
    return rows, expected, path


def _rows(results, cid: str) -> dict:
    """The case's result; a case left out by ``SELFSPEC_ENGINE_CASES`` is skipped, never read from a file."""
    if cid not in results[0]:
        pytest.skip(f"{cid} is not among SELFSPEC_ENGINE_CASES")
    return results[0][cid]


def _verdict(case: tuple, r: dict, expected: dict) -> tuple[bool, str]:
    """(loads cleanly, text for the table) of one pair's result."""
    cid, head, *_rest = case
    if "refused_by_export" in r:
        return False, "refused: " + r["refused_by_export"]
    if cid in NOT_SERVED and not r.get("ok") and NOT_SERVED[cid][0] in r["error"]:
        return False, "not served by the engine: " + NOT_SERVED[cid][1]
    if not r.get("ok"):
        err = r["error"]
        if head.startswith("medusa") and "SpeculativeConfig" in err and "'medusa'" in err:
            return False, "not served: the engine's SpeculativeConfig has no `medusa` method (validation error)"
        return False, "engine error: " + err.splitlines()[0][:160]
    problems = [f"{k} {r[k]}" for k in ("never_loaded", "dropped", "shape_problems") if r[k]]
    lo_hi = r.get("mapped_target_ids")
    if lo_hi and not (0 <= lo_hi[0] and lo_hi[1] < r["target_vocab"]):
        problems.append(f"vocab map {lo_hi} outside the target vocab {r['target_vocab']}")
    want31 = {"fc_norm": head == "eagle31", "norm_output": head == "eagle31"}
    if head.startswith("eagle3") and r.get("eagle31") != want31:
        problems.append(f"the engine's draft built {r.get('eagle31')}, the heads are {want31}")
    if r.get("fuse_rel_error") is not None and r["fuse_rel_error"] > 1e-5:
        problems.append(f"the draft's fused aux differs from selfspec's by {r['fuse_rel_error']:.2e} (relative)")
    if r.get("fc_rel_error") is not None and r["fc_rel_error"] > 1e-5:
        problems.append(f"the draft's fc output differs from selfspec's by {r['fc_rel_error']:.2e} (relative)")
    if r.get("hot_token_id_is_arange_plus_d2t") is False:
        problems.append("hot_token_id != arange + d2t")
    if cid in expected and r.get("captured_hidden_states") != expected[cid]:
        problems.append(f"captures hidden states {r.get('captured_hidden_states')} != trained {expected[cid]}")
    if problems:
        return False, "loads with problems: " + "; ".join(problems)
    fc = "" if r.get("fc_rel_error") is None else "; its fc on the engine's embedding lookup = selfspec's"
    if head == "eagle31":
        fc += "; fc_norm and norm_output on" + ("" if r.get("fuse_rel_error") is None else ", its fused aux = selfspec's")
    return True, f"loads (`{r['draft_class']}`): every parameter loaded, nothing dropped{fc}"


def _write(rows: dict, expected: dict, tmp: str) -> str:
    """The results document `scripts/engine_table.py` reads (each row with its table ``verdict``; tmp
    paths replaced by ``$TMP``), written to ``tmp/results.json`` only; returns that path."""
    from install import ENGINES

    clean = {cid: {k: v for k, v in r.items() if k not in ("engine_params", "traceback")} for cid, r in rows.items()}
    for case in CASES:
        if case[0] in clean:
            clean[case[0]]["verdict"] = _verdict(case, rows[case[0]], expected)[1]
    for r in clean.values():  # tmp paths -> placeholders, so the committed file is stable
        if "serve_args" in r:
            r["serve_args"] = r["serve_args"].replace(tmp, "$TMP")
    path = os.path.join(tmp, "results.json")
    with open(path, "w") as f:
        json.dump({"engines": {k: v["wheel"] for k, v in ENGINES.items()}, "results": clean}, f, indent=1,
                  sort_keys=True)
    return path


@pytest.mark.engines
def test_committed_table_is_the_scripts_output(results):
    """Each computed case's line is the committed table's (all cases: the whole table), as
    scripts/engine_table.py would write it from this run's results."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import engine_table

    with open(results[2]) as f:
        doc = json.load(f)
    with open(os.path.join(ROOT, TABLE)) as f:
        committed = f.read()
    how = f"update with: python scripts/engine_table.py --results {results[2]}"
    lines = engine_table.table_rows(doc["results"])
    stale = [line for line in lines.values() if line not in committed.splitlines()]
    assert not stale, f"{how}\n" + "\n".join(stale)
    if len(lines) == len(CASES):
        assert engine_table.render(doc) == committed, how


CLAIMED = [c for c in CASES if c[5] and c[0] != "medusa-llama-vllm033" and c[0] not in NOT_SERVED]


@pytest.mark.engines
@pytest.mark.parametrize("case", CLAIMED, ids=[c[0] for c in CLAIMED])
def test_engine_loads_export(results, case):
    row = _rows(results, case[0])
    ok, text = _verdict(case, row, results[1])
    assert ok, f"{case[0]}: {text}\n{row.get('traceback', '')}"


@pytest.mark.engines
def test_vllm_033_has_no_medusa(results):
    r = _rows(results, "medusa-llama-vllm033")
    assert not r.get("ok") and "SpeculativeConfig" in r["error"] and "'medusa'" in r["error"], r


@pytest.mark.engines
@pytest.mark.parametrize("cid", sorted(NOT_SERVED))
def test_engine_refuses_unserved_targets(results, cid):
    """Pairs the engine's own code does not serve fail there, with the error the table names (if a new
    engine version serves one, this fails and the pair moves to the claimed ones)."""
    r = _rows(results, cid)
    assert not r.get("ok") and NOT_SERVED[cid][0] in r["error"], r


@pytest.mark.engines
@pytest.mark.parametrize("case", [c for c in CASES if not c[5]], ids=[c[0] for c in CASES if not c[5]])
def test_refusals_are_one_line(results, case):
    msg = _rows(results, case[0])["refused_by_export"]
    assert "\n" not in msg and len(msg) < 400, msg


def test_concurrent_callers_build_an_engine_venv_once(tmp_path, monkeypatch):
    """Two callers at once (two pytest-xdist workers) of `engine_python`: one builds, the other waits on
    the lock and gets the same interpreter (the build is a stand-in that takes a while)."""
    import threading
    import time

    import install

    monkeypatch.setenv("SELFSPEC_CACHE", str(tmp_path))
    builds = []

    def build(name: str, final: str) -> None:
        builds.append(name)
        time.sleep(0.3)  # long enough that the second caller arrives while the first builds
        os.makedirs(os.path.join(final, "bin"))
        open(os.path.join(final, "bin", "python"), "w").close()

    monkeypatch.setattr(install, "_build", build)
    got = []
    callers = [threading.Thread(target=lambda: got.append(engine_python("vllm-0.33.0"))) for _ in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert builds == ["vllm-0.33.0"] and len(got) == 2 and got[0] == got[1] == install.venv_python("vllm-0.33.0")


def test_a_killed_builds_temp_folder_is_removed_by_the_next_build(tmp_path, monkeypatch):
    """A build killed mid-way (the background prefetch of an interrupted run) leaves its temp folder; the
    next build of that venv, under the lock, removes it and builds; other venvs' folders stay."""
    import install

    monkeypatch.setenv("SELFSPEC_CACHE", str(tmp_path))
    engines = tmp_path / "engines"
    (engines / ".vllm-0.33.0-k1ll3d" / "lib").mkdir(parents=True)
    (engines / ".sglang-0.5.23-busy").mkdir()

    def build(name: str, final: str) -> None:
        assert not (engines / ".vllm-0.33.0-k1ll3d").exists()
        os.makedirs(os.path.join(final, "bin"))
        open(os.path.join(final, "bin", "python"), "w").close()

    monkeypatch.setattr(install, "_build", build)
    assert engine_python("vllm-0.33.0") == install.venv_python("vllm-0.33.0")
    assert sorted(p.name for p in engines.iterdir() if p.name.startswith(".")) == [".sglang-0.5.23-busy"]
    assert install.missing() == ["vllm-0.32.0", "sglang-0.5.23"]
    monkeypatch.setattr(install, "missing", lambda: [])
    assert install.prefetch(str(engines / "prefetch.log")) is None  # nothing to build: no process
