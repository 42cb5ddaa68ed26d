"""`bench.ceiling`: the expected accepted length of a tree equals the mean of exact sampling's,
the best tree is the brute-force optimum and bounds every head's tree, and a head's tree on a context is
the one `infer.generate` verifies there."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from test_eagle import self_generated, target, trained_head

import infer
from bench.ceiling import (
    best_tree_value,
    expected_accepted,
    head_tree_value,
    markdown,
    measure_contexts,
    path_probability,
    run,
    sampling_warp,
    summarise,
)
from heads import EagleHead, MedusaHeads, save_heads
from infer.arguments import sampling_warpers
from infer.runner import TreeRunner
from infer.verify import accept_exact

pytestmark = pytest.mark.usefixtures("one_thread")


def warp_at(t: float, **kw):
    from transformers import GenerationConfig

    return sampling_warpers(GenerationConfig(do_sample=True, temperature=t, **kw))


def tree_at(arch: str, ids: torch.Tensor, temperature: float, **shape):
    """A trained head's tree after ``ids`` (its last token the root) and the target's probabilities at
    its nodes: (tree, probs [N+1, V])."""
    m = target(arch)
    prop = infer.SpecModel(m, trained_head(arch)[0]).proposer(**shape)
    prop.decoding(temperature)
    runner = TreeRunner(m, prop.aux_layers, max_len=ids.shape[1] + 16)
    prop.plan(ids.shape[1] + 16)
    out = runner.prefill(ids[:, :-1])
    prop.start(ids[:, :-1], out)
    tree = prop.propose(ids[0, -1], shape.get("depth", 6))
    logits = runner.verify(tree).logits[0]
    return tree, torch.softmax(warp_at(temperature)(None, logits.float()), -1)


def test_expected_accepted_is_the_mean_of_exact_sampling():
    """20000 draws of `accept_exact` on one tree: their mean accepted length is the sum of path
    probabilities, within 4 standard errors."""
    # the target's own text at a low temperature: the tiny random target's logits are nearly flat, so
    # at T = 0.02 its distributions are peaked enough for the trained head's drafts to be accepted often
    tree, probs = tree_at(
        "llama", self_generated("llama")[:1, :20], 0.02, depth=4, draft_top_k=4, total_tokens=16
    )
    exact = float(expected_accepted(probs, tree))
    assert exact > 0.5  # drafts that are accepted, so the check has something to measure
    B, g, lengths = 4000, torch.Generator().manual_seed(0), []
    batch = replace(tree, **{f: getattr(tree, f).expand(B, *getattr(tree, f).shape) for f in
                             ("tokens", "parents", "depth", "ancestors", "retrieve", "sib_before")})  # fmt: skip
    for _ in range(5):
        lengths.append(accept_exact(probs.expand(B, *probs.shape).clone(), batch, g).length.double() - 1)
    x = torch.cat(lengths)
    assert abs(x.mean().item() - exact) < 4 * x.std().item() / len(x) ** 0.5, (x.mean().item(), exact)


def test_path_probability_multiplies_along_the_path():
    tree, probs = tree_at(
        "llama", self_generated("llama")[1:2, :16], 0.05, depth=3, draft_top_k=3, total_tokens=10
    )
    pp = path_probability(probs, tree)
    for i in range(1, tree.num_nodes):
        want, j = 1.0, i
        while j > 0:
            want *= float(probs[tree.parents[j], tree.tokens[j]])
            j = int(tree.parents[j])
        assert pp[i].item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("drafts", [1, 5, 30])
def test_best_tree_is_the_brute_force_optimum(drafts):
    """Depth 2 over all 96 + 96² nodes: the best tree's value is the sum of the top path probabilities."""
    m, warp = target("qwen3"), warp_at(0.7)
    prefix = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(2))
    root = 17
    with torch.no_grad():
        seq = torch.cat([prefix, prefix.new_tensor([[root]])], 1)
        p1 = torch.softmax(warp(None, m(seq).logits[:, -1].float()), -1)[0]  # [V]
        kids = torch.cat([seq.expand(96, -1), torch.arange(96)[:, None]], 1)
        p2 = torch.softmax(warp(None, m(kids).logits[:, -1].float()), -1)  # [V, V]
    paths = torch.cat([p1, (p1[:, None] * p2).flatten()])
    want = paths.double().topk(drafts).values.sum().item()  # the first 96 entries are the depth-1 nodes
    by_depth = best_tree_value(m, prefix, root, warp, drafts, depth=2)
    assert sum(by_depth) == pytest.approx(want, rel=1e-4)
    top = paths.double().topk(drafts)
    assert by_depth[0] == pytest.approx(top.values[top.indices < 96].sum().item(), rel=1e-4)  # depth-1 nodes


def test_head_tree_is_what_generate_verifies_and_best_tree_bounds_it():
    """Greedy, at the position where each step of `infer.generate` started: that step's accepted drafts. Sampled: every head's expectation is below the best tree's, and the trained
    head's above an untrained one's on the same contexts."""
    arch = "llama"
    m = target(arch)
    trained = infer.SpecModel(m, trained_head(arch)[0])
    torch.manual_seed(1)
    fresh = infer.SpecModel(m, EagleHead.for_target(m, draft_layer="target").eval())
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(100))
    run_ = infer.generate(trained, ids, max_new_tokens=40, do_sample=False, adaptive=False, lookup=0)
    new, at, got = run_.sequences[0, ids.shape[1] :], 0, []
    for n in run_.stats.accepted_lengths[:-1]:  # the last step may be cut at max_new_tokens
        prefix = torch.cat([ids, new[None, :at]], 1)
        by_depth = head_tree_value(m, trained.proposer(), prefix, int(new[at]), None, 6)
        assert by_depth == sorted(by_depth, reverse=True) and set(by_depth) <= {0.0, 1.0}
        got.append(sum(by_depth))
        at += n
    assert got == [n - 1 for n in run_.stats.accepted_lengths[:-1]]
    assert max(got) >= 2 and len(got) >= 10

    from transformers import GenerationConfig

    gc = GenerationConfig(do_sample=True, temperature=0.02, top_k=0, max_new_tokens=24, pad_token_id=0)
    props = {"trained": trained.proposer(), "fresh": fresh.proposer()}
    prompts = [self_generated(arch)[i : i + 1, :8] for i in (2, 3)]
    r = measure_contexts(m, props, prompts, gc, sampling_warpers(gc), stride=6, drafts=47, depth=6)
    assert r["contexts"] == [3, 3]
    for label, per_prompt in r["values"].items():  # the depths add up to the total, context by context
        flat = [sum(d) for p in r["depths"][label] for d in p]
        assert flat == pytest.approx(sum(per_prompt, []))
    for label in props:
        for got, best in zip(sum(r["values"][label], []), sum(r["values"]["best tree"], []), strict=True):
            assert got <= best + 1e-4
    s = summarise(r, [("trained", "fresh")], reps=200)
    assert s["vs"]["trained:fresh"]["diff"] > 0.3
    assert 0 < s["tau"]["fresh"]["share_of_best"] < s["tau"]["trained"]["share_of_best"] <= 1 + 1e-6


def test_sampling_warp_is_the_one_generate_uses():
    """T = 0.7 with no top-k set: `infer.generate` and ``target.generate`` add transformers' top-k 50."""
    from transformers import GenerationConfig
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

    warp = sampling_warp(target("llama"), GenerationConfig(do_sample=True, temperature=0.7))
    assert [type(w) for w in warp] == [TemperatureLogitsWarper, TopKLogitsWarper] and warp[1].top_k == 50


def test_command_line_writes_the_report(tmp_path, tiny_eagle_target, capsys):
    directory, heads = tiny_eagle_target
    out = tmp_path / "ceiling"
    report = run(["--target", directory, "--prompts", f"code={directory}/prompts.jsonl", "--heads", f"e={heads}", "--heads", f"f={heads}", "--limit", "1",
                  "--max-new-tokens", "12", "--stride", "4", "--dtype", "fp32", "--threads", "1",
                  "--vs", "e:f", "--out", str(out)])  # fmt: skip
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["results"]) == {"code greedy", "code T=0.7"}
    assert saved["results"]["code T=0.7"]["vs"]["e:f"]["diff"] == 0.0  # the same heads twice
    md = (out / "results.md").read_text()
    assert md == markdown(report) and "| best tree |" in md
    with pytest.raises(SystemExit) as e:  # argparse's one-line error, before any model loads
        run(["--target", directory, "--prompts", f"code={directory}/prompts.jsonl", "--out", str(out)])
    assert e.value.code == 2 and "--heads: give at least one" in capsys.readouterr().err
    medusa = heads.replace("eagle", "medusa")
    with pytest.raises(ValueError, match="one tree size for all heads"):
        run(["--target", directory, "--prompts", f"code={directory}/prompts.jsonl", "--heads", f"e={heads}",
             "--heads", f"m={medusa}", "--dtype", "fp32", "--out", str(out)])  # fmt: skip
    report = run(["--target", directory, "--prompts", f"code={directory}/prompts.jsonl", "--heads", f"e={heads}",
                  "--limit", "1", "--max-new-tokens", "12", "--stride", "4", "--dtype", "fp32", "--modes", "sample",
                  "--depth", "3", "--draft-top-k", "2", "--total-tokens", "6", "--out", str(out)])  # fmt: skip
    assert "trees of 5 drafts, depth <= 3" in report["tree"]
    assert len(report["results"]["code T=0.7"]["tau"]["best tree"]["by_depth"]) == 3


@pytest.fixture
def tiny_eagle_target(tmp_path):
    """A saved tiny Llama with a tokenizer and EAGLE heads, and a one-row prompts file ('code')."""
    from conftest import tiny_model

    from demo import train_tokenizer

    texts = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i, i * i)\n"] * 20
    tok = train_tokenizer(texts, vocab_size=300, max_length=256)
    model = tiny_model("llama", vocab_size=300)
    directory = str(tmp_path / "target")
    model.config._name_or_path = directory
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    torch.manual_seed(0)
    save_heads(EagleHead.for_target(model), str(tmp_path / "eagle"))
    save_heads(MedusaHeads.for_target(model, num_heads=2), str(tmp_path / "medusa"))
    with open(f"{directory}/prompts.jsonl", "w") as f:
        f.write(json.dumps({"text": "def add(a, b):\n    return"}) + "\n")
    return directory, str(tmp_path / "eagle")
