"""Acceptance of exported heads in vLLM and SGLang against selfspec's τ (``scripts/gpu_engine_check.py``).

For trained heads and their target: the prompts are tokenised once (`infer.prompts.load_prompts`: a
row's ``messages`` through the tokenizer's chat template, else its ``text``); ``infer.generate``
decodes them greedily with a chain of ``--depth`` drafts (EAGLE: depth k, top-1, k + 1 nodes;
Medusa: ``infer.chain(k)``), giving selfspec's τ (tokens per target forward, the bonus token
included). The heads are exported (``heads.convert.export_heads``: EAGLE-1 ``vllm`` / ``sglang``,
EAGLE-3 ``speculators`` / ``sglang``, Medusa ``vllm``) and served on the same token ids, greedy, with
the same k:

- vLLM (``vllm.LLM`` with ``speculative_config`` {model, method, num_speculative_tokens: k}): mean
  acceptance length = 1 + ``vllm:spec_decode_num_accepted_tokens`` / ``vllm:spec_decode_num_drafts``
  from ``LLM.get_metrics()``;
- SGLang (``sglang.Engine`` with ``speculative_num_steps`` k, ``speculative_eagle_topk`` 1,
  ``speculative_num_draft_tokens`` k + 1): accept length = Σ ``completion_tokens`` / Σ
  ``spec_verify_ct`` of the outputs' ``meta_info`` (SGLang's own definition; it counts the prefill's
  first token too, so it reads slightly above the per-step mean for short outputs).

Each engine is imported only when asked for, in the process that serves it (one engine per run: their
pinned dependencies rarely share an environment). The check fails (exit 1) when an engine's τ is below
selfspec's by more than ``--tolerance`` (relative): a head the engine computes differently (norm order,
embedding scale, aux layers) drafts tokens the target rejects. Greedy outputs are compared too (the
first differing token per prompt; bf16 kernels may legitimately diverge late). Without a CUDA GPU it
stops at once with one line (exit 2): both engines serve speculative decoding on GPUs only; so does
an export the engine cannot serve (before the long runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

# engine -> the export formats (`heads.convert`) it loads, preferred first; a head type's format is the
# first of these its registry entry exports
ENGINE_FORMATS = {"vllm": ("speculators", "vllm"), "sglang": ("sglang",)}


def export_to(engine: str, head_type: str) -> str | None:
    """The export format ``engine`` loads heads of ``head_type`` from, or None where it serves none."""
    from heads import registry

    exports = registry.get(head_type).exports
    return next((f for f in ENGINE_FORMATS[engine] if f in exports), None)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_engine_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="the target's local directory (engines serve a path)")
    p.add_argument("--heads", required=True, help="selfspec heads directory trained on that target")
    p.add_argument("--engine", required=True, choices=["vllm", "sglang"])
    p.add_argument("--prompts", required=True, help="JSONL prompt file (rows with text or messages)")
    p.add_argument("--n", type=int, default=16, help="prompts used (the first n rows)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--depth", type=int, default=3, help="draft tokens per step k (engines: the same k)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tolerance", type=float, default=0.15, help="allowed relative τ shortfall of the engine")
    p.add_argument("--out", required=True, help="JSON report path")
    return p.parse_args(argv)


def need_gpu() -> None:
    """Exit 2 with one line where there is no CUDA GPU (before anything is loaded)."""
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_engine_check: no CUDA GPU here; vLLM and SGLang serve speculative decoding on GPUs only",
            file=sys.stderr,
        )
        raise SystemExit(2)


def prompt_ids(tokenizer, path: str, n: int) -> list[list[int]]:
    """The first n rows as token ids (`infer.prompts.load_prompts`: chat rows through the chat template,
    text rows whole), the same ids for selfspec and the engine."""
    from infer.prompts import load_prompts

    return [x[0].tolist() for x in load_prompts(path, tokenizer, n, max_tokens=None, need_answer=False)]


def selfspec_run(o: argparse.Namespace, ids: list[list[int]], model) -> dict:
    """Greedy ``infer.generate`` per prompt with a fixed chain of ``o.depth`` drafts (``adaptive=False``:
    the engine drafts that chain every step): τ over all steps and the new token ids."""
    import torch

    import infer
    from heads import registry

    shape = (
        {"tree": infer.chain(o.depth)}
        if registry.of(model.heads).tree == "static"
        else {"depth": o.depth, "draft_top_k": 1, "total_tokens": o.depth + 1}
    )
    device = model.target.get_output_embeddings().weight.device
    new, lengths = [], []
    for row in ids:
        x = torch.tensor([row], device=device)
        out = infer.generate(
            model, x, max_new_tokens=o.max_new_tokens, do_sample=False, adaptive=False, lookup=0, **shape
        )
        new.append(out.sequences[0, len(row) :].tolist())
        lengths += out.stats.accepted_lengths
    return {"tau": sum(lengths) / max(len(lengths), 1), "outputs": new}


def vllm_run(o: argparse.Namespace, draft: str, method: str, ids: list[list[int]]) -> dict:
    from vllm import LLM, SamplingParams

    spec = {"model": draft, "method": method, "num_speculative_tokens": o.depth}
    llm = LLM(
        model=o.target,
        speculative_config=spec,
        dtype=o.dtype,
        disable_log_stats=False,
        skip_tokenizer_init=True,
        enforce_eager=False,
    )
    outs = llm.generate(
        [{"prompt_token_ids": r} for r in ids],
        SamplingParams(temperature=0.0, max_tokens=o.max_new_tokens, detokenize=False),
    )
    counts = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    drafts = counts.get("vllm:spec_decode_num_drafts") or 0
    accepted = counts.get("vllm:spec_decode_num_accepted_tokens") or 0
    return {
        "tau": 1 + accepted / drafts if drafts else None,
        "drafts": drafts,
        "accepted": accepted,
        "outputs": [list(r.outputs[0].token_ids) for r in outs],
    }


def sglang_run(o: argparse.Namespace, draft: str, method: str, ids: list[list[int]]) -> dict:
    import sglang

    eng = sglang.Engine(
        model_path=o.target,
        speculative_algorithm=method.upper(),
        speculative_draft_model_path=draft,
        speculative_num_steps=o.depth,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=o.depth + 1,
        dtype=o.dtype,
        skip_tokenizer_init=True,
    )
    try:
        outs = eng.generate(
            input_ids=ids, sampling_params={"temperature": 0.0, "max_new_tokens": o.max_new_tokens}
        )
    finally:
        eng.shutdown()
    done = sum(r["meta_info"]["completion_tokens"] for r in outs)
    verify = sum(r["meta_info"].get("spec_verify_ct", 0) for r in outs)
    return {
        "tau": done / verify if verify else None,
        "verify_steps": verify,
        "tokens": done,
        "outputs": [list(r["output_ids"]) for r in outs],
    }


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check(o: argparse.Namespace) -> dict:
    import infer
    from heads.convert import export_heads, needs_target_weights

    model = infer.load(o.target, heads=o.heads, dtype=o.dtype)
    kind = model.heads.config.head_type
    method = kind  # the engines' method names are selfspec's head types (SGLang's upper-cased)
    to = export_to(o.engine, kind)
    if to is None:
        print(f"gpu_engine_check: {o.engine} serves no {kind} heads", file=sys.stderr)
        raise SystemExit(2)
    tok = model.tokenizer
    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(o.target)
    ids = prompt_ids(tok, o.prompts, o.n)
    draft = tempfile.mkdtemp(prefix="engine-draft-")
    lm = model.target.get_output_embeddings().weight if needs_target_weights(model.heads, to) else None
    try:  # before the long runs: an export the engine cannot serve is refused in one line
        export_heads(
            model.heads,
            draft,
            to,
            lm,
            speculative_tokens=o.depth,
            target=model.target,
        )
    except ValueError as e:
        print(f"gpu_engine_check: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    mine = selfspec_run(o, ids, model)
    del model  # the engine needs the GPU memory
    run = vllm_run if o.engine == "vllm" else sglang_run
    theirs = run(o, draft, method, ids)
    diffs = [first_difference(a, b) for a, b in zip(mine["outputs"], theirs["outputs"], strict=True)]
    ok = theirs["tau"] is not None and theirs["tau"] >= mine["tau"] * (1 - o.tolerance)
    return {
        "engine": o.engine,
        "head_type": kind,
        "depth": o.depth,
        "prompts": len(ids),
        "selfspec_tau": mine["tau"],
        "engine_tau": theirs["tau"],
        "engine_counts": {k: v for k, v in theirs.items() if k not in ("tau", "outputs")},
        "first_difference": diffs,
        "identical_outputs": sum(d is None for d in diffs),
        "ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    o = parse(argv)
    need_gpu()
    os.makedirs(os.path.dirname(os.path.abspath(o.out)), exist_ok=True)
    report = check(o)
    with open(o.out, "w") as f:
        json.dump(report, f, indent=2)
    print(
        f"{o.engine} {report['head_type']} k={o.depth}: engine τ {report['engine_tau']}, selfspec τ "
        f"{report['selfspec_tau']:.3f}; identical greedy outputs {report['identical_outputs']}/{report['prompts']}"
        f" -> {'ok' if report['ok'] else 'FAILED'}; report: {o.out}"
    )
    return 0 if report["ok"] else 1
