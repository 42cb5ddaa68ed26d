"""The (head type, draft layer, target family, export target, engine) pairs selfspec claims or refuses.

Used by tests/test_engines.py (which runs each in the engine's own code) and by the fast README check.
``engine`` None: the export itself refuses, with the one-line message recorded in the table.
"""

from __future__ import annotations

# id, head, draft_layer, target arch, --to, engine venv (install.ENGINES key) or None, method
CASES: list[tuple[str, str, str, str, str, str | None, str]] = [
    ("medusa-llama-vllm032", "medusa", "-", "llama", "vllm", "vllm-0.32.0", "medusa"),
    ("medusaown-llama-vllm032", "medusaown", "-", "llama", "vllm", "vllm-0.32.0", "medusa"),
    ("medusa-llama-vllm033", "medusa", "-", "llama", "vllm", "vllm-0.33.0", "medusa"),
    ("medusa-llama-sglang", "medusa", "-", "llama", "sglang", None, "medusa"),
    ("eagle-llama-llama-vllm", "eagle", "llama", "llama", "vllm", "vllm-0.33.0", "eagle"),
    ("eagle-llama-llama-sglang", "eagle", "llama", "llama", "sglang", "sglang-0.5.23", "eagle"),
    ("eagle-llama-qwen3-vllm", "eagle", "llama", "qwen3", "vllm", "vllm-0.33.0", "eagle"),
    ("eagle-llama-qwen3-sglang", "eagle", "llama", "qwen3", "sglang", "sglang-0.5.23", "eagle"),
    ("eagle-llama-phi3-vllm", "eagle", "llama", "phi3", "vllm", "vllm-0.33.0", "eagle"),
    ("eagle-llama-phi3-sglang", "eagle", "llama", "phi3", "sglang", "sglang-0.5.23", "eagle"),
    ("eagle-llama-gemma2-vllm", "eagle", "llama", "gemma2", "vllm", "vllm-0.33.0", "eagle"),
    ("eagle-llama-gemma2-sglang", "eagle", "llama", "gemma2", "sglang", "sglang-0.5.23", "eagle"),
    ("eagle-llama-gemma3_text-vllm", "eagle", "llama", "gemma3_text", "vllm", "vllm-0.33.0", "eagle"),
    ("eagle-llama-gemma3_text-sglang", "eagle", "llama", "gemma3_text", "sglang", "sglang-0.5.23", "eagle"),
    ("eaglebias-llama-llama-sglang", "eaglebias", "llama", "llama", "sglang", "sglang-0.5.23", "eagle"),
    ("eaglebias-llama-llama-vllm", "eaglebias", "llama", "llama", "vllm", None, "eagle"),
    ("eagle-target-llama-sglang", "eagle", "target", "llama", "sglang", "sglang-0.5.23", "eagle"),
    ("eagle-target-qwen2-sglang", "eagle", "target", "qwen2", "sglang", "sglang-0.5.23", "eagle"),
    ("eagle-target-qwen2-vllm", "eagle", "target", "qwen2", "vllm", None, "eagle"),
    ("eagle-target-qwen3-sglang", "eagle", "target", "qwen3", "sglang", None, "eagle"),
    ("eagle3-llama-llama-vllm", "eagle3", "llama", "llama", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle3-llama-llama-sglang", "eagle3", "llama", "llama", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle3-llama-qwen3-vllm", "eagle3", "llama", "qwen3", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle3-llama-qwen3-sglang", "eagle3", "llama", "qwen3", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle3-llama-phi3-vllm", "eagle3", "llama", "phi3", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle3-llama-phi3-sglang", "eagle3", "llama", "phi3", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle3-llama-gemma2-vllm", "eagle3", "llama", "gemma2", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle3-llama-gemma2-sglang", "eagle3", "llama", "gemma2", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle3-llama-gemma3_text-vllm", "eagle3", "llama", "gemma3_text", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle3-llama-gemma3_text-sglang", "eagle3", "llama", "gemma3_text", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle3full-llama-llama-vllm", "eagle3full", "llama", "llama", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle3full-llama-llama-sglang", "eagle3full", "llama", "llama", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle3-target-llama-vllm", "eagle3", "target", "llama", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle3-target-qwen3-vllm", "eagle3", "target", "qwen3", "vllm", "vllm-0.33.0", "eagle3"),
    ("eagle3-target-qwen3-sglang", "eagle3", "target", "qwen3", "sglang", None, "eagle3"),
    ("eagle31-llama-llama-vllm", "eagle31", "llama", "llama", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle31-llama-llama-vllm032", "eagle31", "llama", "llama", "speculators", "vllm-0.32.0", "eagle3"),
    ("eagle31-llama-llama-sglang", "eagle31", "llama", "llama", "sglang", "sglang-0.5.23", "eagle3"),
    ("eagle31-llama-qwen3-vllm", "eagle31", "llama", "qwen3", "speculators", "vllm-0.33.0", "eagle3"),
    ("eagle31-target-qwen3-vllm", "eagle31", "target", "qwen3", "vllm", "vllm-0.33.0", "eagle3"),
]

# pairs the engine itself does not serve: id -> (text its error must contain, why, for the table); read
# from the engines' model classes: Gemma2/Gemma3ForCausalLM lack the hooks the EAGLE code paths call
NOT_SERVED: dict[str, tuple[str, str]] = {
    "eagle-llama-gemma2-vllm": (
        "lm_head", "vLLM's `Gemma2ForCausalLM` has no `lm_head` to share, so the EAGLE draft has none"),
    "eagle-llama-gemma2-sglang": (
        "get_embed_and_head", "SGLang's `Gemma2ForCausalLM` has no `get_embed_and_head` for the EAGLE worker"),
    "eagle3-llama-gemma2-vllm": (
        "EAGLE3 interface", "vLLM's `Gemma2ForCausalLM` does not implement `SupportsEagle3`"),
    "eagle3-llama-gemma2-sglang": (
        "set_eagle3_layers_to_capture", "SGLang's `Gemma2ForCausalLM` has no `set_eagle3_layers_to_capture`"),
    "eagle3-llama-gemma3_text-vllm": (
        "EAGLE3 interface", "vLLM's `Gemma3ForCausalLM` does not implement `SupportsEagle3`"),
}

TABLE = "results/engine-support/table.md"
RESULTS = "results/engine-support/results.json"
