"""Load an exported draft with vLLM's own code on CPU (run inside the vLLM venv; see tests/test_engines.py).

The path is the one ``vllm serve`` takes: the serve command's engine arguments parsed by vLLM's own
parser (``EngineArgs.add_cli_args`` / ``from_cli_args``), ``create_engine_config``, a gloo process
group, the target built by ``get_model``, then the proposer's ``load_model`` (``EagleProposer`` or
``MedusaProposer``), which builds the draft class the registry names, runs ``load_weights`` through
the default loader and shares the target's embedding / lm_head where vLLM decides to. The loader is
wrapped only to fill the draft's parameters with NaN first and to record the checkpoint tensors.
"""

from __future__ import annotations

import os
import shlex
import sys
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

if not torch.accelerator.is_available():
    # torch 2.13 raises where vLLM 0.33's torch 2.14 pin returns: freeing a cache that cannot exist
    torch.accelerator.empty_cache = lambda: None
from check_common import RecordingIterator, audit, eagle31_flags, fc_input_error, fill_nan, fuse_error, main  # noqa: E402,E501


def _engine_config(spec: dict):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    argv = shlex.split(spec["serve_args"])  # the README's serve flags, with local paths
    args = parser.parse_args(argv)
    return EngineArgs.from_cli_args(args).create_engine_config()


PORT = {}


def setup(spec: dict) -> None:
    PORT["port"] = spec["port"]


def _init_dist() -> None:
    """A one-rank gloo group, once per process (inside the first case's config context: vLLM reads it)."""
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if not model_parallel_is_initialized():
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{PORT['port']}", 0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)


def _proposer(vc, method: str):
    if method == "medusa":
        from vllm.v1.spec_decode.medusa import MedusaProposer

        return MedusaProposer(vc, torch.device("cpu"))
    from vllm.v1.spec_decode.eagle import EagleProposer

    return EagleProposer(vc, torch.device("cpu"))


def run(spec: dict) -> dict:
    import vllm
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import default_loader, get_model

    vc = _engine_config(spec)
    recorded: dict = {}
    original = default_loader.DefaultModelLoader.load_weights

    def load_weights(self, model, model_config):
        if model_config is not vc.speculative_config.draft_model_config:
            return original(self, model, model_config)
        fill_nan(model)
        inner = self.get_all_weights
        self.get_all_weights = lambda mc, m: recorded.setdefault("it", RecordingIterator(inner(mc, m)))
        try:
            return original(self, model, model_config)
        finally:
            del self.get_all_weights

    default_loader.DefaultModelLoader.load_weights = load_weights
    try:
        with set_current_vllm_config(vc):
            _init_dist()
            target = get_model(vllm_config=vc)
            proposer = _proposer(vc, spec["method"])
            proposer.load_model(target)
    finally:
        default_loader.DefaultModelLoader.load_weights = original
    draft = proposer.model
    out = {"engine": f"vllm {vllm.__version__}", "draft_class": type(draft).__name__}
    shared = {}
    inner = getattr(draft, "model", None)
    if inner is not None and getattr(inner, "embed_tokens", None) is target.model.embed_tokens:
        shared["model.embed_tokens.weight"] = "vLLM shares the target's embedding (the checkpoint has none)"
    if getattr(draft, "lm_head", None) is getattr(target, "lm_head", 0):
        shared["lm_head.weight"] = "vLLM shares the target's lm_head"
    ignored = {"t2d": "vLLM's EAGLE-3 load_weights skips t2d (it maps draft->target ids with d2t only)"}
    out.update(audit(draft, recorded["it"].seen, shared, ignored if spec["method"] == "eagle3" else {}))
    out["target_vocab"] = vc.model_config.get_vocab_size()
    d2t = getattr(draft, "draft_id_to_target_id", None)
    if d2t is not None:  # vLLM maps draft id i to target id i + d2t[i]
        ids = torch.arange(d2t.shape[0]) + d2t.detach().cpu()
        out["mapped_target_ids"] = [int(ids.min()), int(ids.max())]
    if spec["method"] == "eagle":
        # the draft computes its logits with the lm_head shared from the target: a target class without
        # an lm_head attribute (vLLM's Gemma2) leaves it with none, and this raises as serving would
        draft.compute_logits(torch.zeros(1, vc.model_config.get_hidden_size()))
        out["fc_rel_error"] = fc_input_error(draft.model, spec)
    if spec["method"] == "eagle3":
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        # the model runner's own set-up (its supports_eagle3 check included), on a stand-in runner
        runner = SimpleNamespace(use_aux_hidden_state_outputs=True, speculative_config=vc.speculative_config,
                                 model=target, get_model=lambda: target)
        runner._get_eagle3_aux_layers_from_config = lambda: GPUModelRunner._get_eagle3_aux_layers_from_config(runner)
        GPUModelRunner._setup_eagle3_aux_hidden_state_outputs(runner)
        # vLLM's Llama/Qwen forward appends hidden_states + residual *before* layer idx for each idx in
        # aux_hidden_state_layers, in layer order: the input of layer idx = HF hidden_states[idx]
        out["captured_hidden_states"] = sorted(set(int(i) for i in target.model.aux_hidden_state_layers))
        out["eagle31"] = eagle31_flags(draft.model)
        out["fuse_rel_error"] = fuse_error(draft.combine_hidden_states, spec)
    return out


if __name__ == "__main__":
    main(setup, run)
