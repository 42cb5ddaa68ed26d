"""Importing checkpoints that the original trainers wrote (`heads.convert` import side).

``tests/fixtures/foreign/`` holds what FasterDecoding/Medusa's ``train_legacy.py`` (its current "version
2" heads, and the per-head-lm_head heads of an earlier commit), SafeAILab/EAGLE's EAGLE-1
``eagle/train/main.py`` and EAGLE-3 ``traineagle3`` model, SpecForge's EAGLE-3 training and SGLang export,
and vLLM speculators' ``speculators convert`` of the EAGLE-3 checkpoint wrote when run at tiny scale on CPU
by ``make_fixtures.py`` there (upstream commits, commands and what it patches are at its top), the tiny
target they trained on, and ``reference.safetensors``: what the original code computes with those files.
Each is loaded through ``infer.load(target, heads=dir)`` and must (a) compute the original's draft logits, (b) generate greedily exactly what ``target.generate``
does, with drafts accepted, and (c) where the original inference runs on CPU, decode as it does: for
Medusa-1 heads the same number of steps as Medusa's own ``medusa_generate`` on the same prompts and
tree; for SafeAILab's EAGLE-1 and EAGLE-3 drafts the same tree and the same accepted length at every
step as their ``EaModel.eagenerate`` (EAGLE-2 dynamic trees; ``generate.safetensors``). SpecForge's and
speculators' inference (SGLang, vLLM) is not run, only their model classes' forward: the draft logits
are compared. Layouts no real fixture covers (``medusa_head.``-prefixed keys, a
version-less file without per-head lm_heads, refusals) are written by this file's own code, after
reading the trainers' source.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import infer
from heads import run_target
from infer.eagle_draft import EagleProposer

FIX = Path(__file__).parent / "fixtures" / "foreign"
V, H = 96, 32  # the self-written layouts' tiny target (conftest)

pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def their_target():
    """The tiny Llama the original trainers trained on (8 layers, hidden 32, vocab 128, rope_theta 5e5)."""
    return AutoModelForCausalLM.from_pretrained(FIX / "target", dtype=torch.float32).eval()


@functools.cache
def target():
    return tiny_model("llama", num_layers=4)


def reference(name: str) -> dict[str, torch.Tensor]:
    return load_file(FIX / name / "reference.safetensors")


def assert_greedy_identical(spec: infer.SpecModel, ids: torch.Tensor, new: int, **kw) -> infer.GenerateOutput:
    """infer.generate's greedy output == target.generate's, row by row (fp32); returns the last output.
    The fixed tree (``adaptive=False``): the callers check that its drafts are accepted, which adaptation,
    deciding from measured timings, may skip for a plain step."""
    m = spec.target
    for row in ids:
        out = infer.generate(spec, row[None], max_new_tokens=new, do_sample=False, adaptive=False, **kw)
        want = m.generate(row[None], max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(out.sequences, want)
    return out


def medusa_tree(ref: dict[str, torch.Tensor]) -> list[list[int]]:
    return [[int(i) for i in c if i >= 0] for c in ref["tree"]]


@pytest.mark.parametrize("name", ["medusa", "medusa1"])
def test_medusa_trainer_output_computes_their_heads(name):
    """train_legacy.py's config.json + medusa_lm_head.safetensors (bf16): version 2 (HEAD, the heads use
    the target's lm_head) and the per-head lm_head layout (0bfdcd2). The imported heads give the logits
    of Medusa's own MedusaModel forward on the same inputs, and generate exactly the target's tokens."""
    m, ref = their_target(), reference(name)
    spec = infer.load(m, heads=str(FIX / name))
    heads = spec.heads.float()
    assert heads.config.num_heads == 3 and heads.config.num_layers == 1
    assert heads.config.lm_head == ("target" if name == "medusa" else "own")
    with torch.no_grad():
        hidden = m.model(ref["inputs"]).last_hidden_state
        got = heads(hidden, m.get_output_embeddings())  # [K, B, T, V]
    torch.testing.assert_close(got, ref["head_logits"], rtol=1e-4, atol=1e-4)
    out = assert_greedy_identical(spec, ref["inputs"], 24, tree=[[0], [0, 0], [1], [0, 0, 0], [2]])
    assert out.stats.new_tokens == 24 and max(out.stats.accepted_lengths) >= 2


def test_medusa1_steps_match_their_medusa_generate():
    """Medusa's own medusa_generate (temperature 0, its tree) ran 16 steps per prompt on the per-head
    lm_head heads; selfspec with the same tree makes the same tokens in the same number of steps."""
    m, ref = their_target(), reference("medusa1")
    spec = infer.load(m, heads=str(FIX / "medusa1"))
    theirs, ours = 0, 0
    for prompt, words, steps in zip(ref["inputs"], ref["generated"], ref["steps"], strict=True):
        words = words[words >= 0]
        out = infer.generate(
            spec,
            prompt[None],
            max_new_tokens=len(words),
            do_sample=False,
            tree=medusa_tree(ref),
            adaptive=False,
            lookup=0,  # their steps: the heads' tree alone
        )
        assert torch.equal(out.sequences[0, len(prompt) :], words)
        assert abs(len(out.stats.accepted_lengths) - int(steps)) <= 1  # their last step may overshoot
        theirs, ours = theirs + int(steps), ours + len(out.stats.accepted_lengths)
    assert ours == pytest.approx(theirs, rel=0.05)
    assert sum(len(w[w >= 0]) for w in ref["generated"]) / theirs > 1.5  # drafts are accepted


def eagle3_dir(tmp_path: Path) -> Path:
    """What a user publishes from a traineagle3 run: its main.py's state_<epoch>/pytorch_model.bin and the
    config.json the trainer was given."""
    shutil.copy(FIX / "eagle3" / "state_0" / "pytorch_model.bin", tmp_path / "pytorch_model.bin")
    shutil.copy(FIX / "eagle3" / "config.json", tmp_path / "config.json")
    return tmp_path


def test_eagle3_trainer_output_computes_their_draft(tmp_path):
    """traineagle3's raw state dict (fp16; fc, midlayer.*, norm, lm_head, d2t, t2d and 8 target_model.*
    rotary buffers) imports, drops the target's tensors with a warning, and gives the logits of all 7
    steps of their cnets.Model forward on the same rows: step 0 from the target's aux states at t and the
    embedding of token t+1, step j from step j-1's outputs and token t+1+j (zero past the row's end).
    Their config.json has no rope_theta: their draft layer rotates with base 10000, not the target's."""
    m, ref = their_target(), reference("eagle3")
    assert m.config.rope_parameters["rope_theta"] == 5e5
    with pytest.warns(UserWarning, match=r"dropped 8 frozen target tensors \(target_model\.\*\)"):
        spec = infer.load(m, heads=str(eagle3_dir(tmp_path)))
    head = spec.heads.float()
    assert tuple(head.aux_layer_ids) == (2, 4, 5)  # their modeling_llama_kv: inputs of layers 2, L//2, L-3
    ids, want = ref["inputs"], ref["step_logits"]  # [B, T], [K, B, T, draft vocab]
    K = want.shape[0]
    with torch.no_grad():
        aux = torch.cat(run_target(m, ids, aux_layers=head.aux_layer_ids).aux, -1)
        tokens = torch.cat([ids[:, 1:], torch.zeros(len(ids), K, dtype=ids.dtype)], 1)  # [B, T + K - 1]
        got = head(tokens, aux, m.get_input_embeddings(), ttt_steps=K)
    # 5e-3 apart: their rotary inv_freq buffers went through fp16 with the model (main.py saves 16-bit)
    torch.testing.assert_close(got.float(), want, rtol=0, atol=2e-2)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_eagle3_trainer_output_generates_the_target_tokens(tmp_path):
    m, ref = their_target(), reference("eagle3")
    with pytest.warns(UserWarning, match="dropped 8 frozen target tensors"):
        spec = infer.load(m, heads=str(eagle3_dir(tmp_path)))
    prompts = ref["inputs"][:, :9]  # <|user|> 6 words </s> <|assistant|>
    out = assert_greedy_identical(spec, prompts, 24, depth=4, draft_top_k=4, total_tokens=16)
    assert out.stats.new_tokens == 24 and max(out.stats.accepted_lengths) >= 3


def eagle3_step_logits(spec: infer.SpecModel, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """The imported head's TTT logits [steps, B, T, draft vocab] on rows ``ids`` [B, T]: step 0 from the
    target's aux states at t and the embedding of token t+1, step j from step j-1's outputs and token
    t+1+j (zero past the row's end), as the trainers' forwards compute them."""
    m, head = spec.target, spec.heads.float()
    with torch.no_grad():
        aux = torch.cat(run_target(m, ids, aux_layers=head.aux_layer_ids).aux, -1)
        tokens = torch.cat(
            [ids[:, 1:], torch.zeros(len(ids), steps, dtype=ids.dtype)], 1
        )  # [B, T + steps - 1]
        return head(tokens, aux, m.get_input_embeddings(), ttt_steps=steps).float()


def load_rope10k_eagle3(m, ref, name: str):
    """Import fixture ``name`` (an EAGLE-3 draft with RoPE base 10000, aux layers (2, 4, 5), 64 draft tokens)
    and check its step logits against the reference: returns (spec, got, want)."""
    with pytest.warns(UserWarning, match=r"draft was built with RoPE .*'rope_theta': 10000\.0"):
        spec = infer.load(m, heads=str(FIX / name))
    assert tuple(spec.heads.aux_layer_ids) == (2, 4, 5) and spec.heads.config.draft_vocab_size == 64
    want = ref["step_logits"]
    got = eagle3_step_logits(spec, ref["inputs"], len(want))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    return spec, got, want


def test_specforge_export_computes_their_draft():
    """SpecForge (sgl-project) trained its LlamaForCausalLMEagle3 with its own strategy, loss and
    BF16Optimizer, and its export_to_sglang wrote the serving directory (bf16; fc, midlayer.*, norm,
    lm_head, d2t, t2d; no embedding; no eagle_config, so SpecForge's capture [1, L//2-1, L-4] = selfspec's
    (2, L//2, L-3); their config has rope_parameters with base 10000, not the target's 5e5). The import
    gives the logits of all 7 TTT steps of their OnlineEagle3Model forward, and generates exactly the
    target's tokens with drafts accepted."""
    m, ref = their_target(), reference("specforge")
    spec, got, want = load_rope10k_eagle3(m, ref, "specforge")  # [7, B, T, 64]
    out = assert_greedy_identical(spec, ref["inputs"][:, :9], 24, depth=4, draft_top_k=4, total_tokens=16)
    assert out.stats.new_tokens == 24 and max(out.stats.accepted_lengths) >= 3


def test_speculators_convert_computes_their_draft():
    """vLLM speculators' ``speculators convert`` (0.9.0, algorithm eagle3) of the SafeAILab traineagle3
    checkpoint above: Eagle3Speculator config (eagle_aux_hidden_state_layer_ids null, read as vLLM's
    default (2, L//2, L-3); norm_before_residual false; rope_theta 10000 written out), layers.0.* keys,
    fp16, no embedding, the target_model.* tensors gone. The import gives the logits of the 3 TTT steps of
    speculators' own Eagle3DraftModel forward, the same draft as the SafeAILab reference, and generates
    exactly the target's tokens."""
    m, ref = their_target(), reference("speculators")
    raw = json.loads((FIX / "speculators" / "config.json").read_text())
    assert raw["speculators_model_type"] == "eagle3" and raw["eagle_aux_hidden_state_layer_ids"] is None
    spec, got, want = load_rope10k_eagle3(m, ref, "speculators")  # [3, B, T, 64]
    theirs = reference("eagle3")["step_logits"][: len(want)]  # SafeAILab's forward of the same fp16 draft
    torch.testing.assert_close(got, theirs, rtol=0, atol=2e-2)
    out = assert_greedy_identical(spec, ref["inputs"][:, :9], 24, depth=4, draft_top_k=4, total_tokens=16)
    assert out.stats.new_tokens == 24 and max(out.stats.accepted_lengths) >= 3


def eagle1_dir(tmp_path: Path) -> Path:
    """What a user publishes from an eagle/train/main.py run: the draft of its last accelerate
    ``save_state`` (state_20/model.safetensors) and the config.json the trainer was given."""
    shutil.copy(FIX / "eagle1" / "state_20" / "model.safetensors", tmp_path / "model.safetensors")
    shutil.copy(FIX / "eagle1" / "config.json", tmp_path / "config.json")
    return tmp_path


def test_eagle1_trainer_output_computes_their_draft(tmp_path):
    """SafeAILab's EAGLE-1 eagle/train/main.py, run as written for its 21 epochs: its draft (fc with bias,
    layers.0.* without input_layernorm, the frozen embedding copy) imports, gives the features of their
    cnets1.Model forward on the same rows (the target's last hidden state at t and token t+1), and
    generates exactly the target's tokens."""
    m, ref = their_target(), reference("eagle1")
    spec = infer.load(m, heads=str(eagle1_dir(tmp_path)))
    head = spec.heads.float()
    ids = ref["inputs"]
    with torch.no_grad():
        hidden = m(ids, output_hidden_states=True).hidden_states[-1]
        got = head(ids[:, 1:], hidden[:, :-1], m.get_input_embeddings())  # [B, T-1, H]
    torch.testing.assert_close(got, ref["predict"][:, :-1], rtol=1e-4, atol=1e-4)
    out = assert_greedy_identical(spec, ids[:, :9], 24, depth=4, draft_top_k=4, total_tokens=16)
    assert out.stats.new_tokens == 24 and max(out.stats.accepted_lengths) >= 2


def their_eagenerate(name: str, variant: str) -> tuple[torch.Tensor, list[dict], tuple[int, int, int]]:
    """SafeAILab's EaModel.eagenerate (greedy, EAGLE-2 dynamic tree) on the fixture ``name``: (prompts
    [B, T], per prompt {their new tokens, tokens appended per tree forward, the trees they verified:
    tokens and parent indices [S, total_token]}, their tree settings (total_token with the root, depth,
    top_k))."""
    g = load_file(FIX / name / "generate.safetensors")
    runs = []
    for b, (tokens, lengths) in enumerate(
        zip(g[f"{variant}.tokens"], g[f"{variant}.accept_lengths"], strict=True)
    ):
        S = int(g[f"{variant}.steps"][b])
        run = {"tokens": tokens[tokens >= 0], "lengths": lengths[lengths >= 0].tolist()}
        run["trees"] = (g[f"{variant}.tree_tokens"][b, :S].long(), g[f"{variant}.tree_parents"][b, :S].long())
        assert len(run["lengths"]) == S and sum(run["lengths"]) == len(run["tokens"])
        runs.append(run)
    total, depth, top_k = g["tree"].tolist()
    return g["prompts"], runs, (total, depth, top_k)


def eagle_as_they_ran_it(name: str, variant: str, tmp_path: Path) -> infer.SpecModel:
    """The checkpoint imported as the function their EaModel ran: EAGLE-1 ``given`` without ``fc.bias``
    (their EaModel reads the config's ``bias: false`` and drops it), ``with_bias`` as written (the import
    keeps the trained bias); EAGLE-3 as written. EAGLE-2 scores tree nodes by the draft's log_softmax at
    T = 1 (their topK_genrate), so the greedy tree scores are put at T = 1 too."""
    d = eagle3_dir(tmp_path) if name == "eagle3" else eagle1_dir(tmp_path)
    if variant == "given" and name == "eagle1":
        sd = load_file(d / "model.safetensors")
        del sd["fc.bias"]
        save_file(sd, str(d / "model.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the import's warnings are the other tests' business
        spec = infer.load(their_target(), heads=str(d))
    if name == "eagle1":
        assert (spec.heads.fc.bias is not None) == (variant == "with_bias")
    spec.settings = dataclasses.replace(spec.settings, greedy_score_temperature=1.0)
    return spec


@pytest.mark.parametrize("name, variant", [("eagle1", "given"), ("eagle1", "with_bias"), ("eagle3", "given")])
def test_eagle_steps_match_their_eagenerate(name, variant, tmp_path, monkeypatch):
    """SafeAILab's own inference (EaModel.eagenerate, its default EAGLE-2 tree: total_token 60, depth
    7, top_k 10) ran greedily on the prompts of the reference rows (make_fixtures.py eagle-generate).
    selfspec with the same tree settings (its depth is the tree's, root 0; their ``depth`` counts the
    draft forwards after the first level, so their trees are depth + 1 deep) makes their tokens, the
    target's own, verifies the same tree as theirs at every step (the same tokens in the same order,
    the same parents) and accepts as many tokens: both build the EAGLE-2 tree the same way (top-k
    children, top-k frontier by cumulative log-prob, the best total_token - 1 nodes in creation order),
    so their τ is matched exactly, not within noise; a step could only differ where two node scores
    tie within float error at a cut. selfspec runs ``depth + 2`` tokens longer than their output, so
    that no step up to their last is cut short by ``max_new_tokens`` (theirs appends the root and the
    accepted drafts, selfspec the accepted drafts and the bonus token: one token ahead)."""
    m = their_target()
    prompts, runs, (total, depth, top_k) = their_eagenerate(name, variant)
    spec = eagle_as_they_ran_it(name, variant, tmp_path)
    trees = []
    propose = EagleProposer.propose

    def recording(self, root, max_depth):
        trees.append(propose(self, root, max_depth))
        return trees[-1]

    monkeypatch.setattr(EagleProposer, "propose", recording)
    for prompt, run in zip(prompts, runs, strict=True):
        trees.clear()
        n, S = len(run["tokens"]) + depth + 2, len(run["lengths"])
        out = infer.generate(
            spec,
            prompt[None],
            max_new_tokens=n,
            do_sample=False,
            adaptive=False,
            lookup=0,  # their trees and steps: the heads' tree alone
            depth=depth + 1,
            draft_top_k=top_k,
            total_tokens=total,
        )
        want = m.generate(prompt[None], max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(out.sequences, want)
        assert torch.equal(out.sequences[0, len(prompt) : len(prompt) + len(run["tokens"])], run["tokens"])
        assert out.stats.accepted_lengths[:S] == run["lengths"]
        their_tokens, their_parents = run["trees"]
        for s in range(S):
            assert torch.equal(trees[s].tokens, their_tokens[s]), f"step {s}: another tree"
            assert torch.equal(trees[s].parents, their_parents[s]), f"step {s}: another tree shape"
    lengths = [k for r in runs for k in r["lengths"]]
    assert sum(lengths) / len(lengths) > 1.25 and max(lengths) >= 3  # drafts are accepted, deep ones too


def greedy_identical(heads_dir, **kw) -> infer.SpecModel:
    """infer.load(target, heads=dir), then its greedy output == target.generate's (fp32)."""
    m = target()
    spec = infer.load(m, heads=str(heads_dir))
    ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(11))
    out = infer.generate(spec, ids, max_new_tokens=16, do_sample=False, **kw)
    assert torch.equal(out.sequences, m.generate(ids, max_new_tokens=16, do_sample=False))
    return spec


def medusa_blocks(K: int, layers: int, seed: int = 8) -> dict[str, torch.Tensor]:
    """Residual blocks as Medusa's ``medusa_head`` ModuleList names them: {h}.{l}.linear.weight|bias."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for h in range(K):
        for j in range(layers):
            sd[f"{h}.{j}.linear.weight"] = torch.randn(H, H, generator=g) * 0.1
            sd[f"{h}.{j}.linear.bias"] = torch.randn(H, generator=g) * 0.1
    return sd


def medusa_reference(sd, h: int, layers: int, lm_head: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Medusa's head h: ResBlocks x <- x + SiLU(W x + b), then the lm_head."""
    for j in range(layers):
        x = x + torch.nn.functional.silu(x @ sd[f"{h}.{j}.linear.weight"].T + sd[f"{h}.{j}.linear.bias"])
    return x @ lm_head.T


def test_medusa_versionless_heads_use_the_target_lm_head(tmp_path):
    """A file with residual blocks only and no ``version`` field is read as version 2 (the real version-2
    file is tests/fixtures/foreign/medusa)."""
    K, Lm = 3, 1
    sd = medusa_blocks(K, Lm)
    cfg = {"medusa_num_heads": K, "medusa_num_layers": Lm, "base_model_name_or_path": "x/y"}
    json.dump({**cfg, "transformers_version": "4.41.0"}, open(tmp_path / "config.json", "w"))
    save_file(sd, str(tmp_path / "medusa_lm_head.safetensors"))
    spec = greedy_identical(tmp_path)
    heads = spec.heads
    assert heads.config.lm_head == "target" and heads.config.num_heads == K and heads.lm_heads is None
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(3))
    lm = target().get_output_embeddings()
    with torch.no_grad():
        got = heads(x, lm)
    for h in range(K):
        torch.testing.assert_close(got[h], medusa_reference(sd, h, Lm, lm.weight, x), rtol=1e-5, atol=1e-5)


def test_medusa_version2_refusals(tmp_path):
    from heads import load_heads

    K = 2
    sd = medusa_blocks(K, 1)
    json.dump(
        {"medusa_num_heads": K, "medusa_num_layers": 1, "version": "2"}, open(tmp_path / "config.json", "w")
    )
    save_file(sd, str(tmp_path / "medusa_lm_head.safetensors"))
    with pytest.raises(ValueError, match="base model's lm_head; pass the target"):
        load_heads(str(tmp_path))
    save_file(
        {**sd, **{f"{h}.1.weight": torch.zeros(V, H) for h in range(K)}},
        str(tmp_path / "medusa_lm_head.safetensors"),
    )
    with pytest.raises(ValueError, match="version 2 means the heads share"):
        load_heads(str(tmp_path), target())


def test_medusa_head_prefixed_keys(tmp_path):
    """Heads saved through the model's ``medusa_head`` attribute: medusa_head.{h}.{l}.linear.*, and the
    Medusa-1 per-head lm_head medusa_head.{h}.{L}.weight; as a torch.save'd medusa_lm_head.pt."""
    K, Lm = 2, 2
    sd = medusa_blocks(K, Lm, seed=9)
    g = torch.Generator().manual_seed(10)
    lm = {h: torch.randn(V, H, generator=g) * 0.3 for h in range(K)}
    sd.update({f"{h}.{Lm}.weight": w for h, w in lm.items()})
    json.dump({"medusa_num_heads": K, "medusa_num_layers": Lm}, open(tmp_path / "config.json", "w"))
    torch.save({f"medusa_head.{k}": v for k, v in sd.items()}, tmp_path / "medusa_lm_head.pt")
    heads = greedy_identical(tmp_path).heads
    assert heads.config.lm_head == "own" and heads.config.num_layers == Lm
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = heads(x)
    for h in range(K):
        torch.testing.assert_close(got[h], medusa_reference(sd, h, Lm, lm[h], x), rtol=1e-5, atol=1e-5)
