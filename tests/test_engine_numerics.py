"""What the serving engines compute with selfspec's exports, stage by stage, on CPU. Slow.

For each case below, tiny random heads on a tiny random target (4 layers) are exported with
``heads.convert.export_heads``, loaded by the engine's own code in its venv (`tests/engines/install.py`;
the loading path of tests/test_engines.py, every draft parameter NaN before the engine's
``load_weights``), and the engine's own modules are run on the weights it loaded
(`tests/engines/compute_vllm.py`, `compute_sglang.py`). selfspec's draft runs on the same inputs here,
and every stage below must agree to a relative max error of `TOL` (float32 on both sides).

Compared (engine module -> selfspec):

- ``embed``: the engine draft's embedding lookup (the target's, shared) -> the target's embedding
  *weight* rows; ``fc`` (EAGLE-1): the engine's ``fc`` on ``cat(its lookup, features)`` -> selfspec's
  ``fc(cat(embed_module(ids), features))``, so Gemma's sqrt(H) embedding scale folded into ``fc`` by
  the export is checked here.
- ``aux`` (EAGLE-3/3.1): the hidden states the engine's *target* forward captures for the draft
  (vLLM: ``aux_hidden_state_layers`` set up by the model runner's code; SGLang:
  ``set_eagle3_layers_to_capture`` from the draft config, its id - 1 convention) -> the HF target's
  ``hidden_states[i]`` for the heads' ``aux_layer_ids``, concatenated in that order.
- ``fused``: vLLM's ``combine_hidden_states``, SGLang's ``fc`` (with its EAGLE-3.1 ``fc_norm``
  chunks) on that capture -> ``Eagle3Head.fuse``.
- ``input_norm`` / ``hidden_norm`` (EAGLE-3): the layer's ``input_layernorm`` on the embedding and
  ``hidden_norm`` on the fused features (their order: the residual is the un-normed g). Gemma: the
  engines' ``input_layernorm`` sees the raw embedding rows, selfspec's the scaled ones; the norm cancels
  the scale up to its eps, and those cases allow ten times that bound (`_eps_bound`);
- ``q``, ``k``, ``v``: the engine's ``qkv_proj`` output split -> ``q_proj``/``k_proj``/``v_proj``;
- ``q_rope``, ``k_rope``: what the engine's attention module hands its backend (after its rotary
  embedding, vLLM ``RotaryEmbedding.forward_native`` / SGLang's native rotary; Qwen3's q/k norms
  included) -> the q/k selfspec's layer hands its attention function;
- ``attn``: causal SDPA on the engine's q/k/v (**not the engine's attention backend**, which needs a
  GPU: `compute_common.SdpaAttention`) -> selfspec's attention output; ``o_proj``, the
  ``post_attention_layernorm`` (fused add + norm), ``mlp``: the engine's modules -> selfspec's;
- ``out`` (EAGLE-1): the draft's output feature; ``norm`` and ``feed`` (EAGLE-3): the final norm and
  the state handed to the next draft step (EAGLE-3.1 ``norm_output``: post-norm);
- ``logits``: the engine's ``compute_logits`` (EAGLE-1: the target's lm_head it shares; EAGLE-3: its
  own lm_head, vLLM scattering to the target vocabulary through ``draft_id_to_target_id`` with -inf
  elsewhere, SGLang mapping through ``hot_token_id``) -> selfspec's draft logits in target ids (the
  same -inf positions required);
- Medusa (vLLM 0.32): each head's residual blocks and ``compute_logits`` -> ``MedusaHeads``.

Not compared: the engines' attention backends and KV cache, CUDA kernels (the engines' native PyTorch
paths run instead: vLLM dispatches to them on CPU anyway), the proposers' drafting loops (token shifting,
tree building, multi-step feedback through the cache) and acceptance: those need a GPU and are what
``scripts/gpu_engine_check.py`` measures (acceptance lengths against selfspec's τ).

Also checked: ``target_out``, the engine's own target forward after its final norm against HF's (so an
``aux`` difference is the capture, not the target). The per-layer ``aux.0..2`` errors name the layer
whose capture differs. SGLang's Gemma-3 capture differs (`SGLANG_GEMMA3_CAPTURE`): that case has its own
test. docs/serving.md ("What the engines compute") has the same list as a table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import pytest
import torch
from conftest import tiny_model

from heads.convert import export_heads

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "engines"))
from install import engine_python  # noqa: E402
from test_engines import _heads, serve_args  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
L, T = 4, 6
TOL = 1e-4
# id, head, draft layer, target, --to, engine venv, method: one of each draft class and input path
NUMERIC_CASES = [
    ("medusa-llama-vllm032", "medusa", "-", "llama", "vllm", "vllm-0.32.0", "medusa"),
    ("medusaown-llama-vllm032", "medusaown", "-", "llama", "vllm", "vllm-0.32.0", "medusa"),
    ("eagle-llama-llama-vllm", "eagle", "llama", "llama", "vllm", "vllm-0.33.0", "eagle"),
    ("eagle-llama-gemma3_text-vllm", "eagle", "llama", "gemma3_text", "vllm", "vllm-0.33.0", "eagle"),
    ("eagle3-llama-llama-vllm", "eagle3", "llama", "llama", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle3full-llama-qwen3-vllm", "eagle3full", "llama", "qwen3", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle31-llama-llama-vllm", "eagle31", "llama", "llama", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle3-llama-phi3-vllm", "eagle3", "llama", "phi3", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle31-target-qwen3-vllm", "eagle31", "target", "qwen3", "vllm", "vllm-0.33.0", "eagle3"),
    ("eagle3-target-qwen3-vllm", "eagle3", "target", "qwen3", "vllm", "vllm-0.33.0", "eagle3"),
    ("eagle31-llama-llama-vllm032", "eagle31", "llama", "llama", "speculators", "vllm-0.32.0", "eagle3"),
    ("eagle-llama-llama-sglang", "eagle", "llama", "llama", "sglang", "sglang-0.5.23", "eagle"),
    ("eaglebias-llama-llama-sglang", "eaglebias", "llama", "llama", "sglang", "sglang-0.5.23", "eagle"),
    ("eagle-target-qwen2-sglang", "eagle", "target", "qwen2", "sglang", "sglang-0.5.23", "eagle"),
    ("eagle-llama-gemma3_text-sglang", "eagle", "llama", "gemma3_text", "sglang", "sglang-0.5.23", "eagle"),
    ("eagle3-llama-llama-sglang", "eagle3", "llama", "llama", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle3full-llama-qwen3-sglang", "eagle3full", "llama", "qwen3", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle31-llama-llama-sglang", "eagle31", "llama", "llama", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle3-llama-phi3-sglang", "eagle3", "llama", "phi3", "sglang", "sglang-0.5.23", "eagle3"),
    (
        "eagle3-llama-gemma3_text-sglang",
        "eagle3",
        "llama",
        "gemma3_text",
        "sglang",
        "sglang-0.5.23",
        "eagle3",
    ),
]
# ``SELFSPEC_ENGINE_CASES`` (comma-separated substrings of case ids), as in tests/test_engines.py
_ONLY = [w for w in os.environ.get("SELFSPEC_ENGINE_CASES", "").split(",") if w]
SELECTED = [c for c in NUMERIC_CASES if not _ONLY or any(w in c[0] for w in _ONLY)]


class _Stages:
    """name -> [..] float tensor of selfspec's draft, from forward hooks (batch dim dropped)."""

    def __init__(self) -> None:
        self.got: dict[str, torch.Tensor] = {}
        self.handles: list = []

    def put(self, name: str, t: torch.Tensor) -> None:
        self.got.setdefault(name, t.detach().float().clone())

    def watch(self, module, name: str) -> None:
        self.handles.append(module.register_forward_hook(lambda m, a, o: self.put(name, _first(o)[0])))

    def watch_layer(self, layer) -> None:
        """The layer's projections, post-attention norm and MLP, and (through a pass-through attention
        implementation) the rotated q / k its attention function gets and that function's output."""
        attn = layer.self_attn
        for p, name in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("o_proj", "o_proj")):
            self.watch(getattr(attn, p), "draft." + name)
        self.watch(layer.post_attention_layernorm, "draft.post_attention_layernorm")
        self.watch(layer.mlp, "draft.mlp")
        self.attn, self.impl = attn, attn.config._attn_implementation

    def __enter__(self):
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        eager = sys.modules[type(self.attn).__module__].eager_attention_forward
        inner = ALL_ATTENTION_FUNCTIONS.get_interface(self.impl, eager)

        def probe(module, q, k, v, mask, **kw):
            out = inner(module, q, k, v, mask, **kw)
            self.put("draft.q_rope", q[0])
            self.put("draft.k_rope", k[0])
            self.put("draft.attn", out[0][0].reshape(q.shape[2], -1))
            return out

        AttentionInterface.register("selfspec_probe", probe)
        self.attn.config._attn_implementation = "selfspec_probe"
        return self

    def __exit__(self, *exc) -> None:
        self.attn.config._attn_implementation = self.impl
        for h in self.handles:
            h.remove()


def _first(o):
    return o[0] if isinstance(o, (tuple, list)) else o


def _in_target_ids(logits: torch.Tensor, head) -> torch.Tensor:
    """Draft-vocabulary logits [T, Vd] -> [T, V] at target ids ``i + d2t[i]``, -inf elsewhere (as vLLM's
    ``compute_logits`` returns them); full-vocabulary logits unchanged."""
    V = head.config.vocab_size
    if logits.shape[-1] == V:
        return logits
    out = torch.full((logits.shape[0], V), float("-inf"))
    out[:, torch.arange(logits.shape[-1]) + head.d2t] = logits
    return out


def _eps_bound(head, rows: torch.Tensor) -> torch.Tensor:
    """EAGLE-3 on a target whose embedding scales by s (Gemma): the engines' ``input_layernorm`` sees the
    raw rows, selfspec's the scaled ones, which differ by at most eps (1 - 1/s^2) / (2 ms) relative
    (ms: a row's mean square; `heads.eagle.formats`); 0 for s = 1."""
    s = float(head.config.embed_scale or 1.0)
    eps = float(head.input_norm.variance_epsilon)
    return torch.tensor(eps * (1 - 1 / s**2) / (2 * float(rows.float().pow(2).mean(-1).min())))


def _selfspec(head, target, method: str, case: dict) -> dict[str, torch.Tensor]:
    """selfspec's stages on the case's inputs (see the module docstring for the names)."""
    s = _Stages()
    ids = torch.tensor(case.get("ids", []))
    embed = target.get_input_embeddings()
    with torch.no_grad():
        if method == "medusa":
            hidden = torch.tensor(case["hidden"])
            feats = head.features(hidden)
            logits = head(hidden, target.get_output_embeddings())
            for h in range(len(feats)):
                s.put(f"block.{h}", feats[h])
                s.put(f"logits.{h}", logits[h])
            return s.got
        s.put("embed", embed.weight[ids])
        layer = head.layers[0] if method == "eagle" else head.midlayer
        s.watch_layer(layer)
        with s:
            if method == "eagle":
                s.watch(head.fc, "fc")
                out = head(ids[None], torch.tensor(case["features"])[None], embed)[0]
                s.put("out", out)
                s.put("logits", head.logits(out, target.get_output_embeddings()))
            else:
                prompt = torch.tensor(case["prompt"])
                hs = target(prompt[None], output_hidden_states=True).hidden_states
                aux = torch.cat([hs[i][0] for i in head.aux_layer_ids], dim=-1)
                s.put("target_out", hs[-1][0])  # after the final norm
                s.put("aux", aux)
                s.put("fused", head.fuse(aux))
                s.watch(head.input_norm, "input_norm")
                s.put("_eps_bound", _eps_bound(head, embed.weight[ids]))
                s.watch(head.hidden_norm, "hidden_norm")
                s.watch(layer, "prenorm")
                feed = head(ids[None], aux[None], embed)[0]
                s.put("norm", head.norm(s.got.pop("prenorm")))
                s.put("feed", feed)
                s.put("logits", _in_target_ids(head.logits(feed), head))
    return s.got


def _inputs(head, target, method: str) -> dict:
    g = torch.Generator().manual_seed(11)
    V, H = target.config.vocab_size, target.config.hidden_size
    if method == "medusa":
        return {"hidden": torch.randn(T, H, generator=g).tolist()}
    case = {"ids": torch.randint(0, V, (T,), generator=g).tolist()}
    if method == "eagle":
        case["features"] = torch.randn(T, H, generator=g).tolist()
    else:
        case["prompt"] = torch.randint(0, V, (T,), generator=g).tolist()
    return case


def _from_json(d: dict) -> torch.Tensor:
    t = torch.tensor(d["values"], dtype=torch.float32)
    t[d["neg_inf"]] = float("-inf")
    return t.reshape(d["shape"])


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        return float("inf")
    fin = torch.isfinite(want)
    if not torch.equal(fin, torch.isfinite(got)):
        return float("inf")  # -inf (outside the draft vocabulary) at other positions
    return float((got[fin] - want[fin]).abs().max() / want[fin].abs().max().clamp_min(1e-12))


def _run(engine: str, cases: list[dict], tmp: str, port: int) -> dict[str, dict]:
    driver = "compute_vllm.py" if engine.startswith("vllm") else "compute_sglang.py"
    spec, out = os.path.join(tmp, f"{engine}.json"), os.path.join(tmp, f"{engine}-out.json")
    with open(spec, "w") as f:
        json.dump({"port": port, "cases": cases}, f)
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "SGLANG_USE_CPU_ENGINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": "",
    }
    proc = subprocess.run(
        [engine_python(engine), os.path.join(ROOT, "tests", "engines", driver), spec, out],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if not os.path.isfile(out):
        raise AssertionError(f"{engine} driver wrote nothing: {proc.stderr[-3000:]}")
    with open(out) as f:
        return {r["id"]: r for r in json.load(f)}


@pytest.fixture(scope="module")
def computed(tmp_path_factory):
    """case id -> (selfspec's stages, the engine's result)."""
    tmp = str(tmp_path_factory.mktemp("numerics"))
    targets, by_engine, want = {}, {}, {}
    for cid, head_kind, layer, arch, to, engine, method in SELECTED:
        if arch not in targets:
            m = tiny_model(arch, num_layers=L)
            m.config.architectures = [type(m).__name__]
            m.save_pretrained(os.path.join(tmp, arch))
            targets[arch] = m
        target = targets[arch]
        head = _heads(head_kind, layer, target)
        draft = os.path.join(tmp, cid)
        expected = (
            pytest.warns(UserWarning, match="Gemma-3 capture")
            if cid == SGLANG_GEMMA3_CAPTURE
            else nullcontext()
        )
        with expected:  # that export says what the case measures
            export_heads(
                head, draft, to, target.get_output_embeddings().weight if method == "medusa" else None
            )
        case = {
            "id": cid,
            "method": method,
            "serve_args": serve_args(engine, method, os.path.join(tmp, arch), draft),
            **_inputs(head, target, method),
        }
        want[cid] = _selfspec(head, target, method, case)
        by_engine.setdefault(engine, []).append(case)
    got = {}
    jobs = [(engine, cases, tmp, 29700 + i) for i, (engine, cases) in enumerate(sorted(by_engine.items()))]
    with ThreadPoolExecutor(2) as pool:  # the drivers spend most of their time importing the engine
        for r in pool.map(lambda job: _run(*job), jobs):
            got.update(r)
    return {cid: (want[cid], got[cid]) for cid in want}


def _errors(computed, cid) -> tuple[dict[str, float], float, str]:
    """(stage -> relative max error, the case's tolerance, the engine's draft class)."""
    want, r = computed[cid]
    want = dict(want)
    assert r.get("ok"), f"{cid}: {r.get('error')}\n{r.get('traceback', '')}"
    stages = {k: _from_json(v) for k, v in r["stages"].items()}
    if "aux" in want and "aux" in stages:  # per aux layer, in the heads' order: which capture is off
        for d in (want, stages):
            d.update({f"aux.{i}": c for i, c in enumerate(d["aux"].chunk(3, dim=-1))})
    tol = max(TOL, 10 * float(want.pop("_eps_bound", torch.tensor(0.0))))
    missing = sorted(set(want) - set(stages))
    assert not missing, f"{cid}: the engine's forward never produced {missing}"
    return {k: _rel_error(stages[k], w) for k, w in want.items()}, tol, r["draft_class"]


# SGLang 0.5.23's Gemma-3 forward keeps the residual apart across layers and captures ``hidden_states``
# before layer i: the block output of layer i - 1 without the residual stream, not HF's hidden_states[i]
# (only id 0, the embedding output, is the same): an engine-side difference no export can undo.
SGLANG_GEMMA3_CAPTURE = "eagle3-llama-gemma3_text-sglang"


@pytest.mark.engines
@pytest.mark.parametrize("cid", [c[0] for c in SELECTED if c[0] != SGLANG_GEMMA3_CAPTURE])
def test_engine_computes_what_selfspec_drafts(computed, cid):
    errors, tol, cls = _errors(computed, cid)
    bad = {k: e for k, e in errors.items() if not e <= tol}
    assert not bad, (
        f"{cid} ({cls}): stages differ from selfspec's (relative max error > {tol:.1e}): {bad}; all: {errors}"
    )


@pytest.mark.engines
@pytest.mark.skipif(SGLANG_GEMMA3_CAPTURE not in [c[0] for c in SELECTED], reason="case not selected")
def test_sglang_gemma3_eagle3_capture_is_not_hf_hidden_states(computed):
    """SGLang computes the Gemma-3 target as HF does (``target_out``) and the draft's own input path as
    selfspec does (``input_norm``, within the embedding-scale bound), but its aux capture for ids 2 and 3
    differs (see `SGLANG_GEMMA3_CAPTURE`). If an SGLang release captures the residual stream, this fails
    and the case joins the others."""
    errors, tol, _ = _errors(computed, SGLANG_GEMMA3_CAPTURE)
    assert errors["target_out"] <= TOL and errors["aux.0"] <= TOL and errors["input_norm"] <= tol, errors
    assert errors["aux.1"] > 0.1 and errors["aux.2"] > 0.1, errors


def test_gpu_engine_check_stops_without_a_gpu(tmp_path):
    """`scripts/gpu_engine_check.py` parses its arguments, and where no CUDA device is visible it stops
    with one line and exit status 2, before importing either engine or writing its report."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['gpu_engine_check.py', '--engine', 'vllm', '--target', 't', '--heads', 'h', '--prompts', 'p',"
        f" '--out', {str(tmp_path / 'r.json')!r}]\n"
        "try:\n    runpy.run_path('scripts/gpu_engine_check.py', run_name='__main__')\n"
        "except SystemExit as e:\n    print('EXIT', e.code, 'vllm' in sys.modules, 'sglang' in sys.modules)\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": ROOT}
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.stdout.strip().splitlines()[-1:] == ["EXIT 2 False False"], (p.stdout, p.stderr[-2000:])
    assert p.stderr.strip().splitlines() == [
        "gpu_engine_check: no CUDA GPU here; vLLM and SGLang serve speculative decoding on GPUs only"
    ], p.stderr
    assert not (tmp_path / "r.json").exists()
    bad = subprocess.run(
        [sys.executable, "scripts/gpu_engine_check.py", "--engine", "tgi"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "invalid choice: 'tgi'" in bad.stderr, bad.stderr


def test_sglang_gemma3_eagle3_export_warns(tmp_path):
    """The export says what `test_sglang_gemma3_eagle3_capture_is_not_hf_hidden_states` measures: an
    EAGLE-3 head for a Gemma-3 target, exported for SGLang, warns; for a Llama target it does not."""
    import warnings

    gemma, llama = tiny_model("gemma3_text", num_layers=L), tiny_model("llama", num_layers=L)
    with pytest.warns(UserWarning, match="Gemma-3 capture for aux ids > 0 lacks the residual stream"):
        export_heads(_heads("eagle3", "llama", gemma), str(tmp_path / "g"), "sglang")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        export_heads(_heads("eagle3", "llama", llama), str(tmp_path / "l"), "sglang")
