"""Shared fixtures: tiny random decoder-only LMs of several architectures, built from configs (no downloads)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# torch's OpenMP threads spin while idle by default; on a 2-core machine running anything else beside
# them (a DeepSpeed rank, a tokenizer) that makes each op up to 10x slower. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _cores_per_worker() -> int:
    """This process's share of the cores: all of them, or under pytest-xdist (``-n N``) cores // N, so N
    workers never run more compute threads than there are cores (oversubscribed, each op slows down)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, cores // workers)


WORKER_THREADS = _cores_per_worker()
if "PYTEST_XDIST_WORKER" in os.environ:  # before torch loads; the subprocesses tests start inherit it
    os.environ.setdefault("OMP_NUM_THREADS", str(WORKER_THREADS))

import pytest  # noqa: E402
import torch  # noqa: E402

if "PYTEST_XDIST_WORKER" in os.environ:
    torch.set_num_threads(WORKER_THREADS)

# The files that take longest on 2 cores, longest first, except that the engine tests come after the first
# two so that the background venv build has a head start. With `--dist loadfile` pytest-xdist hands files
# out in collection order (pyproject's addopts turn off its reordering by test count), so the long files
# start early and the two workers finish together instead of one running a long file at the end.
LONGEST_FILES = (
    *("test_compile_inductor.py", "test_zero3.py", "test_engines.py", "test_engine_numerics.py"),
    *("test_distribution_tree.py", "test_real_target_engines.py", "test_distribution_eagle.py"),
    *("test_reliability_train.py", "test_recipes.py", "test_draft_layer.py", "test_real_target.py"),
)


def pytest_collection_modifyitems(items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-file order kept


_ENGINE_PREFETCH: list = []


def pytest_collection_finish(session) -> None:
    """When engine tests are selected, start building the missing engine venvs in the background (one
    process, from the first worker), so that the downloads overlap the other tests."""
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0" or session.config.option.collectonly:
        return
    if not any(item.get_closest_marker("engines") for item in session.items):
        return
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "engines"))
    import install

    proc = install.prefetch(os.path.join(install.cache_dir(), "prefetch.log"))
    if proc is not None:
        _ENGINE_PREFETCH.append(proc)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Let the background build finish (another worker's engine test may be waiting on it), unless the
    run was interrupted: a Ctrl-C reached it too (same process group), and it is stopped if still running
    (the next build removes a killed build's temp folder)."""
    for proc in _ENGINE_PREFETCH:
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            proc.terminate()
        proc.wait()


ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3", "gpt2"]
# Architectures the EAGLE heads' Llama draft layer (draft_layer: llama) is tested on:
# ARCHS, plus GPT-NeoX, Falcon, OLMo-2, Cohere, Phi (phi-1/2), StarCoder2, Granite, two mixture-of-experts
# targets, Gemma-3 text (mixed sliding / full layers, a window shorter than the test contexts) and
# EXAONE-4 (post-norm layers with q/k norms, sliding / full), and OPT (learned positions, its decoder called
# past the base model, its final norm inside that decoder).
DRAFT_ARCHS = [
    *ARCHS,
    *("gpt_neox", "falcon", "olmo2", "cohere", "phi", "starcoder2", "granite"),
    *("qwen2_moe", "mixtral", "gemma3_text", "exaone4", "opt"),
]


def tiny_config(arch: str, vocab_size: int = 96, hidden_size: int = 32, num_layers: int = 2, seed: int = 0):
    """A random tiny config of ``arch``; sizes vary a little with ``seed`` so tests see several shapes."""
    import transformers as tf

    common = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=hidden_size, n_layer=num_layers, n_head=4, n_positions=256, **common)
    heads = dict(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if arch == "llama":
        return tf.LlamaConfig(**heads, **common, rope_theta=10000.0 + 1000 * seed)
    if arch == "qwen2":
        return tf.Qwen2Config(**heads, **common)
    if arch == "qwen3":
        return tf.Qwen3Config(**heads, head_dim=hidden_size // 4, **common)
    if arch == "mistral":
        return tf.MistralConfig(**heads, sliding_window=None, **common)
    if arch == "gemma2":
        return tf.Gemma2Config(**heads, head_dim=hidden_size // 4, sliding_window=256, **common)
    if arch == "phi3":
        return tf.Phi3Config(**heads, **common)
    return _draft_only_config(arch, heads, common)


def _draft_only_config(arch: str, heads: dict, common: dict):
    """Tiny configs of the architectures only `DRAFT_ARCHS` uses (each with its characteristic options)."""
    import transformers as tf

    H = heads["hidden_size"]
    mha = {k: v for k, v in heads.items() if k != "num_key_value_heads"}
    if arch == "gpt_neox":  # partial rotary (25%), parallel residual, LayerNorm
        return tf.GPTNeoXConfig(**mha, **common)
    if arch == "falcon":  # Falcon-7B style: multi-query attention, parallel attention + MLP
        return tf.FalconConfig(
            hidden_size=H,
            num_hidden_layers=heads["num_hidden_layers"],
            num_attention_heads=4,
            multi_query=True,
            parallel_attn=True,
            max_position_embeddings=256,
            **common,
        )
    if arch == "olmo2":  # norms after attention and MLP, q/k norms
        return tf.Olmo2Config(**heads, **common)
    if arch == "cohere":  # parallel block, LayerNorm without bias, tied lm_head, logit_scale; a wider init
        # (the tied 0.02-std embedding is the lm_head) so that a random model's logits are not flat
        return tf.CohereConfig(**heads, logit_scale=0.5, initializer_range=0.2, **common)
    if arch == "phi":  # phi-1/2: partial rotary (50%), parallel block, dense + fc1/fc2
        return tf.PhiConfig(**heads, **common)
    if arch == "starcoder2":  # LayerNorm, biases, GELU MLP
        return tf.Starcoder2Config(**heads, sliding_window=None, **common)
    if arch == "granite":  # embedding / residual / attention / logit multipliers
        return tf.GraniteConfig(
            **heads,
            embedding_multiplier=4.0,
            residual_multiplier=0.5,
            attention_multiplier=0.2,
            logits_scaling=2.0,
            **common,
        )
    if arch == "qwen2_moe":  # routed experts + a shared expert
        return tf.Qwen2MoeConfig(
            **heads,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=H,
            shared_expert_intermediate_size=H,
            **common,
        )
    if arch == "mixtral":
        return tf.MixtralConfig(**heads, num_local_experts=4, num_experts_per_tok=2, **common)
    if arch == "gemma3_text":  # sliding and full layers, window (8) shorter than the test contexts
        return tf.Gemma3TextConfig(
            **heads,
            head_dim=H // 4,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * (heads["num_hidden_layers"] // 2)
            + ["sliding_attention"] * (heads["num_hidden_layers"] % 2),
            **common,
        )
    if arch == "exaone4":  # post-norm layers (no input norm), q/k norms, sliding and full layers
        return tf.Exaone4Config(
            **heads,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * (heads["num_hidden_layers"] // 2)
            + ["full_attention"] * (heads["num_hidden_layers"] % 2),
            **common,
        )
    if arch == "opt":  # learned positions, ReLU MLP, the final norm inside the decoder the LM calls directly
        return tf.OPTConfig(
            hidden_size=H,
            ffn_dim=heads["intermediate_size"],
            num_hidden_layers=heads["num_hidden_layers"],
            num_attention_heads=4,
            max_position_embeddings=256,
            **common,
        )
    raise ValueError(arch)


def tiny_model(arch: str, seed: int = 0, dtype=torch.float32, attn: str = "eager", **kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(arch, seed=seed, **kw)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=dtype)
    model.config._name_or_path = f"tiny-random-{arch}"
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls run many times faster on one thread than on two busy cores; restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def reset_accelerate() -> None:
    """Forget accelerate's singleton state, so the next in-process training run builds its own."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def fresh_accelerate():
    """One thread (the models are tiny; extra threads only contend on a 2-core machine) and a clean
    accelerate state after the test, for tests that run training in-process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    reset_accelerate()


@pytest.fixture(params=ARCHS)
def arch(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _worker_threads():
    """Under pytest-xdist, cap the worker's thread count again after each test: code under test may raise
    it (the benchmarks take one thread per core), and the other workers share those cores. Never raised
    here, so a module's `one_thread` holds."""
    yield
    if "PYTEST_XDIST_WORKER" in os.environ and torch.get_num_threads() > WORKER_THREADS:
        torch.set_num_threads(WORKER_THREADS)


def tiny_demo_llama(texts: list[str], context: int, specials: list[str] | None = None, chat_template=None):
    """A 2-layer random Llama (hidden 32, 4 heads, 2 KV heads, seed 0) over the demo tokenizer recipe
    trained on ``texts``: ``context`` is both the tokenizer's ``max_length`` and the model's
    ``max_position_embeddings``; ``specials`` are added as special tokens before the vocabulary is sized.
    Returns (model in eval mode without gradients, tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import demo

    tok = demo.train_tokenizer(texts, vocab_size=300, max_length=context)
    if specials:
        tok.add_special_tokens({"additional_special_tokens": specials})
    if chat_template is not None:
        tok.chat_template = chat_template
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=context, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval().requires_grad_(False), tok


def reference_greedy(m, ids, n):
    """The target's own greedy continuation: ids [1, T] -> [1, T + n]."""
    return m.generate(ids, max_new_tokens=n, do_sample=False)


def check_greedy_identity(
    m, head, n: int = 24, seed: int = 7, high: int = 96, tree: dict | None = None
) -> None:
    """Speculative greedy decoding with ``head`` on target ``m`` equals ``m.generate``: ``n`` new tokens
    after a 6-token prompt (ids in [3, ``high``), generator seed ``seed``), on ``tree`` (keyword arguments
    of ``infer.generate``; default a fixed tree: depth 4, top-4, 16 nodes, no adaptation)."""
    import infer

    tree = dict(depth=4, draft_top_k=4, total_tokens=16, adaptive=False) if tree is None else tree
    ids = torch.randint(3, high, (1, 6), generator=torch.Generator().manual_seed(seed))
    out = infer.generate(infer.SpecModel(m, head), ids, max_new_tokens=n, do_sample=False, **tree)
    assert torch.equal(out.sequences, reference_greedy(m, ids, n))
