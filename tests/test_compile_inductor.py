"""``compile=True`` (inductor) with heads whose drafts are accepted: greedy output token-identical to
``target.generate`` (batch 1, and each row of a batch of 3 against ``target.generate`` of that row
alone), deep accepts, nothing compiled again after a batch size's first generation, and exact sampling
(chi-square against the enumerated law: each head type on both targets at batch 3, on Llama at batch 1).

Heads: Medusa (own lm_heads), EAGLE-1 and EAGLE-3, each fitted for a few seconds to the target's own
greedy continuations of the later prompts generated here, so that most drafts are accepted and long
paths go through the compiled verify step, the cache compaction and the compiled draft steps. Targets:
a tiny Llama with sdpa (tree attention, static cache) and a tiny Qwen-3 with eager attention (additive
tree masks, q/k norms). Graphs are counted on each step's own code object (`infer.compiled`); the
second to fourth generations run under dynamo's ``error_on_recompile``.

Inductor compiles C++ on first use (minutes on 2 shared cores), so this file is slow-marked and
keeps one target per architecture and one set of heads per head type for the whole module.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter

import pytest
import torch
from conftest import tiny_model
from test_distribution import chi2_pvalue, warp_probs
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

import infer
from heads import Eagle3Head, EagleHead, MedusaHeads, eagle3_train_forward, eagle_train_forward, run_target
from infer.compiled import compiled, compiled_step
from infer.draft import medusa_topk
from infer.eagle_draft import draft_step

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("one_thread", "compile_in_process"),
    pytest.mark.filterwarnings("ignore:aux_layer_ids .* not strictly increasing:UserWarning"),
]

ATTN = {"llama": "sdpa", "qwen3": "eager"}
NEW = 40  # new tokens per generation (the third batch-1 generation: NEW + 6)
EAGLE_TREE = {"depth": 5, "draft_top_k": 3, "total_tokens": 16}


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 90, (1, length), generator=torch.Generator().manual_seed(seed))


# batch 1: a first prompt, then two of its length and one of another; batch 3: a first batch, then
# three more, of 3 rows of 8 to 12 tokens, left-padded. The heads are not fitted to the first prompts
# (`training_text`): their drafts are often rejected, so the first generation meets a step that accepts
# no draft (a one-pair draft commit, a graph of its own) as later ones may.
SINGLE = [prompt(9, 50), prompt(9, 0), prompt(9, 1), prompt(13, 2)]
BATCHES = [[prompt(8 + 2 * j, 10 * g + j)[0] for j in range(3)] for g in range(4)]


@pytest.fixture(scope="module")
def compile_in_process():
    """Inductor compiles its C++ in this process, not in a pool of 2 compile workers: on 2 cores shared
    with the other pytest worker the pool only adds its start-up (one test, cold cache: 60 CPU-s instead of 74)."""
    import torch._inductor.config as inductor_config

    before = inductor_config.compile_threads
    inductor_config.compile_threads = 1
    yield
    inductor_config.compile_threads = before


@functools.cache
def target(arch: str):
    m = tiny_model(arch, attn=ATTN[arch])
    m.generation_config.eos_token_id = None
    return m


@functools.cache
def reference(arch: str, row: tuple[int, ...], n: int, eos: tuple[int, ...] = ()) -> list[int]:
    """``target.generate``'s greedy new tokens for one unpadded prompt (stopping at ``eos``)."""
    out = target(arch).generate(torch.tensor([row]), do_sample=False, max_new_tokens=n, pad_token_id=0,
                                eos_token_id=list(eos) or None)  # fmt: skip
    return out[0, len(row) :].tolist()


def staggered_eos(arch: str, rows: list[torch.Tensor]) -> tuple[int, ...]:
    """Two EOS ids that end row 0 early and row 1 half-way while row 2 runs to the limit, so that the
    batch shrinks to two rows, then one: the one-row graphs are compiled in this first generation."""
    conts = [reference(arch, tuple(r.tolist()), NEW) for r in rows]
    for a in conts[0][2:12]:
        for b in conts[1][12:30]:
            if a != b and a not in conts[1] + conts[2] and b not in conts[0] + conts[2]:
                return a, b
    raise AssertionError("no such pair of tokens in these continuations")


def training_text(arch: str) -> torch.Tensor:
    """[n, T]: the target's greedy continuations of every prompt generated here, and of 8 others."""
    rows = [p[0] for p in SINGLE[1:]] + [r for b in BATCHES[1:] for r in b]
    rows += [prompt(5, 100 + i)[0] for i in range(8)]
    seqs = [r.tolist() + reference(arch, tuple(r.tolist()), NEW + 8) for r in rows]
    T = min(len(s) for s in seqs)
    return torch.tensor([s[-T:] for s in seqs])


@functools.cache
def heads(arch: str, kind: str) -> nn.Module:
    """Heads of ``kind`` fitted to `training_text` (Adam, a few hundred full-batch steps)."""
    m, data = target(arch), training_text(arch)
    ones = torch.ones_like(data)
    torch.manual_seed(0)
    if kind == "medusa":
        h = MedusaHeads.for_target(m, num_heads=4, lm_head="own").train()
        with torch.no_grad():
            hidden = run_target(m, data).hidden[:, :-5]  # position t predicts t + 2 + k
        opt = torch.optim.Adam(h.parameters(), lr=3e-2)
        for _ in range(80):
            logits = h(hidden.reshape(-1, hidden.shape[-1]), m.get_output_embeddings())  # [K, N, V]
            loss = sum(
                nn.functional.cross_entropy(logits[k], data[:, 2 + k : data.shape[1] - 3 + k].reshape(-1))
                for k in range(4)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        return h.eval().requires_grad_(False)
    h = (EagleHead if kind == "eagle" else Eagle3Head).for_target(m, draft_layer="llama").train()
    with torch.no_grad():
        out = run_target(m, data, aux_layers=tuple(getattr(h.config, "aux_layer_ids", None) or ()))
    opt = torch.optim.AdamW(h.parameters(), lr=1e-2)
    for _ in range(200):
        if kind == "eagle":
            loss, _ = eagle_train_forward(
                h, out, data, ones, ones, m.get_output_embeddings(), m.get_input_embeddings()
            )
        else:
            loss, _ = eagle3_train_forward(h, out, data, ones, ones, out.logits, m.get_input_embeddings())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return h.eval().requires_grad_(False)


def spec(arch: str, kind: str) -> tuple[infer.SpecModel, dict]:
    return infer.SpecModel(target(arch), heads(arch, kind)), ({} if kind == "medusa" else EAGLE_TREE)


def step_fns(arch: str, kind: str) -> list:
    """The copies of the step functions this target and these heads compile into (`infer.compiled`)."""
    h = heads(arch, kind)
    aux = tuple(getattr(h.config, "aux_layer_ids", None) or ())
    draft = compiled(medusa_topk if kind == "medusa" else draft_step, "inductor").copies.get(h)
    return [compiled_step(target(arch), aux, "inductor").fn, *([draft] if draft is not None else [])]


def graph_count(arch: str, kind: str) -> int:
    total = 0
    for fn in step_fns(arch, kind):
        code = getattr(fn, "_torchdynamo_orig_callable", fn).__code__
        total += len(_debug_get_cache_entry_list(code))
    return total


@contextlib.contextmanager
def no_recompile():
    """Dynamo raises on any recompilation inside the block, and compiles no new frame either."""
    before = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    assert counters["stats"]["unique_graphs"] == before, "a new graph was compiled"


def left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for j, r in enumerate(rows):
        ids[j, T - len(r) :], mask[j, T - len(r) :] = r, 1
    return ids, mask


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_compiled_greedy_identity_deep_accepts_no_recompile(arch, kind):
    """Batch 1, then batch 3: four generations each. Every output equals target.generate's (per row);
    drafts are accepted at each batch size (τ and the longest accepted run bounded below, on the prompts
    the heads were fitted to); the first generation of each batch size compiled graphs and the second to fourth
    compiled nothing. The first batch generation stops two rows early by EOS (`staggered_eos`): a batch
    that shrinks to one row compiles its one-row graphs when that first happens (`infer.compiled`),
    which here is in that generation."""
    model, tree = spec(arch, kind)
    taus, longest, compiled_per_gen = {1: [], 3: []}, {1: 0, 3: 0}, []
    runs = [(p, None, NEW + 6 * (i == 3), ()) for i, p in enumerate(SINGLE)]
    runs += [
        (*left_padded(rows), NEW, staggered_eos(arch, rows) if g == 0 else ())
        for g, rows in enumerate(BATCHES)
    ]
    for i, (ids, mask, n, eos) in enumerate(runs):
        before = graph_count(arch, kind)
        with no_recompile() if i % 4 else contextlib.nullcontext():
            out = infer.generate(model, ids, attention_mask=mask, max_new_tokens=n, do_sample=False, compile=True,
                                 eos_token_id=list(eos), **tree)  # fmt: skip
        compiled_per_gen.append(graph_count(arch, kind) - before)
        rows = [ids[0]] if mask is None else [r[m.bool()] for r, m in zip(ids, mask, strict=True)]
        for j, row in enumerate(rows):
            want = reference(arch, tuple(row.tolist()), n, eos)
            got = out.sequences[j, ids.shape[1] :].tolist()
            assert got == want + [0] * (len(got) - len(want)), (i, j)
        if i % 4:
            b = len(rows)
            taus[b] += [s.mean_accepted_length for s in out.stats.rows or [out.stats]]
            longest[b] = max(longest[b], *out.stats.accepted_lengths)
    assert compiled_per_gen[0] >= 2 and compiled_per_gen[4] >= 1, compiled_per_gen
    assert compiled_per_gen[1:4] == [0, 0, 0] and compiled_per_gen[5:] == [0, 0, 0], compiled_per_gen
    for b in (1, 3):  # at each batch size: the single-row loop and the batched one
        assert sum(taus[b]) / len(taus[b]) > 2.0, (b, taus)
        assert longest[b] >= 4, (b, longest)


SAMPLE_PROMPT = torch.tensor([[5, 9, 14]])
WARP = {"temperature": 0.8, "top_k": 3}


def target_law(m, length: int) -> dict[tuple, float]:
    """Exact probability of every continuation of SAMPLE_PROMPT of ``length`` tokens under the warped
    target (top-3 keeps 3**length continuations), by enumeration with full forwards."""
    law: dict[tuple, float] = {(): 1.0}
    for _ in range(length):
        seqs = list(law)
        batch = torch.tensor([SAMPLE_PROMPT[0].tolist() + list(s) for s in seqs])
        with torch.no_grad():
            probs = warp_probs(m(batch).logits[:, -1], **WARP).double()
        law = {(*s, x): law[s] * float(row[x]) for s, row in zip(seqs, probs, strict=True) for x in row.nonzero()[:, 0].tolist()}  # fmt: skip
    return law


# every head type through the batched loop, and the single-row loop on both architectures (both loops
# share `_Rule` and the acceptance functions; greedy identity above covers every head type on both
# architectures at both batch sizes)
SAMPLED = [("llama", kind, 3) for kind in ("medusa", "eagle", "eagle3")] + [("llama", "eagle", 1), ("qwen3", "eagle3", 1)]


@pytest.mark.parametrize(("arch", "kind", "rows"), SAMPLED)
def test_compiled_sampling_follows_the_target_law(arch, kind, rows):
    """1500 three-token samples (batches of ``rows`` copies of one prompt) drawn with compile=True and
    exact acceptance follow the warped target's law (chi-square, p > 1e-3), with drafts accepted."""
    model, tree = spec(arch, kind)
    law = target_law(target(arch), 3)
    ids = SAMPLE_PROMPT.expand(rows, -1)
    g = torch.Generator().manual_seed(0)
    counts, accepted = Counter(), []
    for _ in range(1500 // rows):
        out = infer.generate(model, ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=True,
                             generator=g, compile=True, **WARP, **tree)  # fmt: skip
        counts.update(tuple(r) for r in out.sequences[:, 3:].tolist())
        accepted += out.stats.accepted_lengths
    assert max(accepted) >= 2  # drafts were accepted: the tree walk under compile is exercised
    assert chi2_pvalue(counts, law) > 1e-3
