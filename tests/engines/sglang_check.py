"""Load an exported draft with SGLang's own code on CPU (run inside the SGLang venv; see tests/test_engines.py).

The path ``python -m sglang.launch_server`` takes for the draft: the launch flags parsed by SGLang's
own parser (``ServerArgs.add_cli_args`` / ``from_cli_args``, ``device="cpu"``), ``ModelConfig.
from_server_args(..., is_draft_model=True)``, ``get_model_architecture``, and ``get_model`` (the default
loader: construction and the draft class's ``load_weights``). The target is loaded the same way, and
the draft then gets the target's embedding (and lm_head for EAGLE-1) as SGLang's EAGLE worker gives
them (``set_embed`` / ``set_embed_and_head``, ``speculative/eagle_worker_v2.py``); the target's capture
layers are set by ``set_eagle3_layers_to_capture`` from the draft config's ``eagle_config`` as SGLang's
model runner does (``spec_aux_hidden_state.py``). The loader is wrapped only to fill the draft's
parameters with NaN first and to record the checkpoint tensors.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from check_common import RecordingIterator, audit, eagle31_flags, fc_input_error, fill_nan, main  # noqa: E402


def _server_args(spec: dict):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(shlex.split(spec["serve_args"])))


PORT = {}


def setup(spec: dict) -> None:
    PORT["port"] = spec["port"]


def _init_dist(sa) -> None:
    """Publish the launch args as SGLang's scheduler process does; a one-rank gloo group once."""
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, publish

    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=None))
    if PORT.get("done"):
        return
    PORT["done"] = True
    port = PORT["port"]

    init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel(backend="gloo")


def _load(sa, path: str, draft: bool):
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model
    from sglang.srt.model_loader.utils import get_model_architecture

    mc = ModelConfig.from_server_args(sa, model_path=path, is_draft_model=draft)
    cls, arch = get_model_architecture(mc)
    model = get_model(model_config=mc, load_config=LoadConfig(load_format="auto"), device_config=DeviceConfig("cpu"))
    return model, mc, cls.__name__


def run(spec: dict) -> dict:
    import sglang
    from sglang.srt.model_loader import loader

    sa = _server_args(spec)
    _init_dist(sa)
    recorded: dict = {}
    original = loader.DefaultModelLoader.load_weights_and_postprocess

    def load_weights_and_postprocess(model, weights, target_device):
        if recorded.get("armed"):
            fill_nan(model)
            weights = recorded.setdefault("it", RecordingIterator(weights))
        return original(model, weights, target_device)

    loader.DefaultModelLoader.load_weights_and_postprocess = staticmethod(load_weights_and_postprocess)
    try:
        target, _, _ = _load(sa, sa.model_path, False)
        recorded["armed"] = True
        draft, mc, cls = _load(sa, sa.speculative_draft_model_path, True)
    finally:
        loader.DefaultModelLoader.load_weights_and_postprocess = staticmethod(original)
    ec = getattr(mc.hf_config, "eagle_config", None) or {}
    if spec["method"] == "eagle3":  # the target's model runner sets up the capture before the EAGLE worker
        target.set_eagle3_layers_to_capture(ec.get("eagle_aux_hidden_state_layer_ids"))
    embed, head = target.get_embed_and_head()
    shared = {"model.embed_tokens.weight": "SGLang's EAGLE worker gives the draft the target's embedding"}
    if spec["method"] == "eagle3":
        draft.set_embed(embed)
    else:
        draft.set_embed_and_head(embed, head)
        shared["lm_head.weight"] = "SGLang's EAGLE worker gives an EAGLE-1 draft the target's lm_head"
    out = {"engine": f"sglang {sglang.__version__}", "draft_class": cls}
    seen = recorded["it"].seen
    ignored = {}
    hot = getattr(draft, "hot_token_id", None)
    if hot is not None:  # SGLang maps draft id i to target id hot_token_id[i]
        out["mapped_target_ids"] = [int(hot.min()), int(hot.max())]
        if "d2t" in seen:
            d2t = seen["d2t"]
            out["hot_token_id_is_arange_plus_d2t"] = torch.equal(hot.cpu(), torch.arange(d2t.shape[0]) + d2t)
            ignored["d2t"] = "SGLang's load_weights turns d2t into hot_token_id = arange + d2t (checked)"
    if "t2d" in seen:
        ignored["t2d"] = "SGLang's EAGLE-3 load_weights skips t2d (it maps draft->target ids with d2t only)"
    out.update(audit(draft, seen, shared, ignored))
    out["target_vocab"] = int(target.config.vocab_size)
    if spec["method"] == "eagle":
        out["fc_rel_error"] = fc_input_error(draft.model, spec)
    if spec["method"] == "eagle3":
        # SGLang's Llama/Qwen forward appends hidden_states + residual before running layer i for each
        # i in layers_to_capture, in layer order: the input of layer i = HF hidden_states[i]
        out["captured_hidden_states"] = sorted(set(int(i) for i in target.model.layers_to_capture))
        out["eagle31"] = eagle31_flags(draft.model)
    return out


if __name__ == "__main__":
    main(setup, run)
