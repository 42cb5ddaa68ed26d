"""The heads side of failing safe: what a push uploads, paths and sizes read from a checkpoint,
input validation of `infer.generate` / `infer.load`, and the target fingerprint.

Pushes run the real huggingface_hub client (HfApi.create_repo / create_commit, CommitOperationAdd, the
preupload and commit payloads) against an in-process HTTP transport that stands in for the Hub; only the
network is replaced. Every bad checkpoint here fails with one short line, before anything is built."""

from __future__ import annotations

import base64
import json
import os

import pytest
import torch
from conftest import tiny_model

import infer
from heads import EagleHead, MedusaHeads, load_heads, save_heads
from heads import hub as H
from heads.guard import check_sizes, inside


@pytest.fixture(scope="module")
def target(one_thread):
    return tiny_model("llama")


def _medusa(target, directory, **kw) -> MedusaHeads:
    heads = MedusaHeads.for_target(target, num_heads=3, **kw)
    save_heads(heads, str(directory))
    return heads


def _edit_config(directory, **changes) -> None:
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(path, "w") as f:
        json.dump(cfg, f)


def _one_line(e: pytest.ExceptionInfo, limit: int = 400) -> str:
    text = str(e.value)
    assert "\n" not in text and len(text) < limit, text
    return text


# ---------------------------------------------------------------------------------------------- #4 push


class FakeHub:
    """The Hub's HTTP side for one push, in process: answers create-repo, YAML validation, preupload
    (every file as a regular git blob) and commit, and keeps what the real client sent."""

    def __init__(self, monkeypatch) -> None:
        import httpx2
        from huggingface_hub import constants
        from huggingface_hub.utils import _http

        self.requests: list[tuple[str, str, bytes]] = []
        self.committed: dict[str, bytes] = {}
        self.created: dict = {}
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the transport below is the only "network"
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        _http.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(self.handle)))

    def handle(self, request):
        import httpx2

        body = request.read()
        path = request.url.path
        self.requests.append((request.method, path, body))
        if path == "/api/repos/create":
            self.created = json.loads(body)
            return httpx2.Response(200, json={"url": "https://huggingface.co/org/m", "name": "org/m"})
        if path == "/api/validate-yaml":
            return httpx2.Response(200, json={"warnings": []})
        if "/preupload/" in path:
            files = json.loads(body)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            return httpx2.Response(200, json={"files": modes})
        if "/commit/" in path:
            for line in body.splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    self.committed[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            url = "https://huggingface.co/org/m/commit/abc"
            return httpx2.Response(200, json={"commitUrl": url, "commitOid": "abc", "pullRequestUrl": None})
        return httpx2.Response(404, json={"error": f"unexpected {request.method} {path}"})


@pytest.fixture
def fake_hub(monkeypatch):
    from huggingface_hub.utils import _http

    hub = FakeHub(monkeypatch)
    yield hub
    _http.set_client_factory(_http.default_client_factory)


def test_push_uploads_the_allow_list_only_private_and_without_local_paths(target, tmp_path, fake_hub, capsys):
    out = tmp_path / "run"
    heads = MedusaHeads.for_target(target, num_heads=2)
    base = str(tmp_path / "models" / "my-llama")  # an absolute local path, as training records it
    heads.config.base_model_name_or_path = base
    heads.config.target_adapter = str(tmp_path / "loras" / "lora-a")  # a local adapter, as recorded
    heads.save_pretrained(str(out), eval_results={"step": 3, "top1": [0.5, 0.2], "sim_accept_length": 1.6})
    secrets = {"id_rsa": b"-----BEGIN KEY-----", "secrets.txt": b"hf_secret", "data.jsonl": b'{"text": "x"}\n',
               "checkpoints/step-2/model.safetensors": b"x", "adapter/README.md": b"peft card",
               "notes/config.json": b"{}", ".env": b"TOKEN=1"}  # fmt: skip
    for rel, data in secrets.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    (out / "train_config.yaml").write_text(
        f"data:\n  path: {tmp_path}/data.jsonl\n  format: text\noutput_dir: {out}\n"
    )
    (out / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
    (out / "adapter" / "adapter_model.safetensors").write_bytes(b"y")
    (out / "inference.json").write_text(json.dumps({"depth": 4}))  # tuned settings travel with the heads
    allowed = ["README.md", "adapter/adapter_config.json", "adapter/adapter_model.safetensors", "config.json",
               "eval_results.json", "inference.json", "model.safetensors", "train_config.yaml"]  # fmt: skip
    assert H.upload_files(str(out)) == allowed

    H.push_heads_dir(str(out), "org/m", token="hf_x", write_card=False)
    printed = capsys.readouterr().out
    assert f"uploading to org/m (private if created): {', '.join(allowed)}" in printed
    assert "not uploaded: 7 other file(s)" in printed
    assert fake_hub.created["visibility"] == "private"  # hub_private: null means private
    assert sorted(fake_hub.committed) == allowed
    for rel, data in fake_hub.committed.items():
        assert str(tmp_path).encode() not in data, rel  # no absolute path of this machine leaves it
    cfg = json.loads(fake_hub.committed["config.json"])
    assert cfg["base_model_name_or_path"] == "my-llama" and cfg["target_adapter"] == "lora-a"
    assert cfg["num_heads"] == 2
    assert b"data.jsonl" in fake_hub.committed["train_config.yaml"]  # the name is kept, the path is not
    assert (
        json.loads(fake_hub.committed["adapter/adapter_config.json"])["base_model_name_or_path"] == "my-llama"
    )
    assert fake_hub.committed["model.safetensors"] == (out / "model.safetensors").read_bytes()
    assert (
        json.loads((out / "config.json").read_text())["base_model_name_or_path"] == base
    )  # local: untouched

    H.push_heads_dir(str(out), "org/m", token="hf_x", private=False)
    assert fake_hub.created["visibility"] == "public"  # public only when asked


def test_push_refuses_a_card_with_a_local_path_and_files_that_leave_the_directory(target, tmp_path, fake_hub):
    out = tmp_path / "h"
    _medusa(target, out)
    (out / "README.md").write_text(f"# my heads\ntrained from {out}/data\n")
    with pytest.raises(ValueError, match=r"README.md names the local path") as e:
        H.push_heads_dir(str(out), "org/m", token="hf_x")
    _one_line(e)
    (out / "README.md").unlink()
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"secret")
    os.symlink(outside, out / "eval_results.json")  # an allowed name, pointing out of the directory
    with pytest.raises(ValueError, match="outside the checkpoint"):
        H.push_heads_dir(str(out), "org/m", token="hf_x")
    assert not fake_hub.committed


def test_model_card_holds_no_absolute_path(target, tmp_path):
    cfg = MedusaHeads.for_target(target).config.to_dict() | {
        "base_model_name_or_path": "/home/me/models/llama-8b",
        "target_adapter": "/home/me/loras/my-lora",
    }
    train = {
        "data": {"path": "/home/me/data/train.jsonl", "format": "text", "eval_path": "/home/me/data/e.jsonl"}
    }
    card = H.model_card_text(cfg, train_config=train, repo_id="/home/me/out/heads")
    assert "/home/me" not in card and "llama-8b" in card and "train.jsonl" in card
    assert "base_model:" not in card.split("---")[1] and "datasets" not in card.split("---")[1]


# ---------------------------------------------------------------------------------------------- #6 paths


@pytest.mark.parametrize("recorded", ["../../somewhere", "/abs/adapter", "~/adapter", "adapter/../../x"])
def test_target_adapter_path_outside_the_heads_is_refused(target, tmp_path, recorded):
    heads_dir = tmp_path / "snap" / "heads"
    _medusa(target, heads_dir)
    (tmp_path / "somewhere").mkdir()  # "../../somewhere" exists and is a directory
    (tmp_path / "somewhere" / "adapter_config.json").write_text("{}")
    _edit_config(heads_dir, target_adapter=recorded)
    with pytest.raises(
        ValueError, match="target_adapter .*(absolute path|leaves the checkpoint).*pass adapter="
    ) as e:
        infer.load(str(tmp_path / "no-target-needed"), str(heads_dir))
    _one_line(e)


def test_symlinks_out_of_the_heads_directory_are_refused(target, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "adapter_config.json").write_text("{}")
    heads_dir = tmp_path / "h"
    _medusa(target, heads_dir)
    os.symlink(elsewhere, heads_dir / "adapter")
    _edit_config(heads_dir, target_adapter="adapter")
    with pytest.raises(ValueError, match="resolves to .*outside the checkpoint"):
        infer.load(str(tmp_path / "t"), str(heads_dir))
    # fixed file names too: a weights file linked from elsewhere is not read
    other = tmp_path / "other"
    _medusa(target, other)
    (heads_dir / "model.safetensors").unlink()
    os.symlink(other / "model.safetensors", heads_dir / "model.safetensors")
    _edit_config(heads_dir, target_adapter=None)
    with pytest.raises(ValueError, match="model.safetensors' resolves to .*outside the checkpoint"):
        load_heads(str(heads_dir), target)


def test_importer_weights_file_linked_from_elsewhere_is_refused(target, tmp_path):
    from safetensors.torch import save_file

    save_file({"0.0.linear.weight": torch.zeros(32, 32)}, str(tmp_path / "elsewhere.safetensors"))
    orig = tmp_path / "medusa-original"
    orig.mkdir()
    (orig / "config.json").write_text(json.dumps({"medusa_num_heads": 1, "medusa_num_layers": 1}))
    os.symlink(tmp_path / "elsewhere.safetensors", orig / "medusa_lm_head.safetensors")
    with pytest.raises(
        ValueError, match="medusa_lm_head.safetensors' resolves to .*outside the checkpoint"
    ) as e:
        load_heads(str(orig), target)
    _one_line(e)


def test_hub_snapshot_symlinks_into_its_own_blobs_are_inside(target, tmp_path):
    repo = tmp_path / "models--org--heads"
    blobs, snap = repo / "blobs", repo / "snapshots" / "c0ffee"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "b1").write_text("{}")
    os.symlink("../../blobs/b1", snap / "config.json")
    assert inside(str(snap), "config.json") == str(snap / "config.json")
    (tmp_path / "x").write_text("")
    os.symlink(str(tmp_path / "x"), snap / "inference.json")
    with pytest.raises(ValueError, match="outside the checkpoint"):
        inside(str(snap), "inference.json")


# ---------------------------------------------------------------------------------------------- #7 sizes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_layers": 20000}, r"'num_layers' must be an int in \[0, 64\], got 20000"),
        ({"num_heads": 10**9}, r"'num_heads' must be an int in \[1, 64\]"),
        ({"vocab_size": -1}, r"'vocab_size' must be an int in \[1, 4194304\]"),
        ({"hidden_size": "32"}, r"'hidden_size' must be an int in \[1, 65536\], got '32'"),
        (
            {"num_layers": 2},
            r"does not match medusa heads .*missing \[blocks.0.1.linear.bias, .*\(6 in all\)",
        ),
        ({"lm_head": "own"}, r"does not match medusa heads .*missing \[lm_heads.0.weight"),
        ({"lm_head": 5}, "lm_head must be str, got '5'"),
    ],
)
def test_config_sizes_are_bounded_and_checked_against_the_header(target, tmp_path, change, message):
    _medusa(target, tmp_path)
    _edit_config(tmp_path, **change)
    with pytest.raises(ValueError, match=message) as e:
        load_heads(str(tmp_path), None)
    _one_line(e)


@pytest.mark.parametrize("draft_layer", ["target", "llama"])
def test_eagle_target_config_sizes_are_bounded_and_match_the_header(target, tmp_path, draft_layer):
    save_heads(EagleHead.for_target(target, draft_layer=draft_layer), str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    name = (
        "target_config" if draft_layer == "target" else "draft_layer_config"
    )  # what the layer is built from
    for key, value, message in [
        ("intermediate_size", 10**9, rf"'{name}.intermediate_size' must be an int in \[1, 1048576\]"),
        (
            "intermediate_size",
            128,
            r"does not match eagle heads .*shapes differ: \[layers.0.mlp.down_proj.weight",
        ),
        ("num_attention_heads", True, rf"'{name}.num_attention_heads' must be an int"),
        ("auto_map", {"AutoModelForCausalLM": "x.Y"}, rf"{name}.auto_map names remote model code"),
    ]:
        _edit_config(tmp_path, **{name: cfg[name] | {key: value}})
        with pytest.raises(ValueError, match=message) as e:
            load_heads(str(tmp_path), target)
        _one_line(e)


def test_huge_weights_header_mismatch_is_one_short_line(target, tmp_path):
    from safetensors.torch import save_file

    _medusa(target, tmp_path)
    save_file({f"junk.{i}": torch.zeros(1) for i in range(5000)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing .*unexpected \[junk.0, .*\(5000 in all\)") as e:
        load_heads(str(tmp_path), target)
    _one_line(e)
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="could not be read") as e:
        load_heads(str(tmp_path), target)
    _one_line(e)


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"tree": [[0], [96]]}, r"tree rank 96 is beyond the vocabulary; ranks must be in \[0, 95\]"),
        ({"tree": [[i] for i in range(5000)]}, r"the tree has 5000 nodes; allowed: \[0, 4096\]"),
    ],
)
def test_medusa_saved_tree_ranks_and_size_are_bounded(target, tmp_path, tree, message):
    _medusa(target, tmp_path)
    (tmp_path / "inference.json").write_text(json.dumps(tree))
    with pytest.raises(ValueError, match=message) as e:
        infer.load(target, heads=str(tmp_path))  # tree files are infer's settings (`infer.settings`)
    assert "inference.json" in _one_line(e)


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        (
            {"depth": 4000, "draft_top_k": 4, "total_tokens": 16},
            r"'depth' must be an int in \[1, 64\], got 4000",
        ),
        (
            {"depth": 4, "draft_top_k": 4, "total_tokens": 10**7},
            r"'total_tokens' must be an int in \[2, 4096\]",
        ),
        ({"depth": 4, "draft_top_k": 97, "total_tokens": 16}, r"'draft_top_k' must be an int in \[1, 96\]"),
    ],
)
def test_eagle_saved_budget_is_bounded(target, tmp_path, tree, message):
    save_heads(EagleHead.for_target(target), str(tmp_path))
    (tmp_path / "inference.json").write_text(json.dumps(tree))
    with pytest.raises(ValueError, match=message) as e:
        infer.load(target, heads=str(tmp_path))
    assert "inference.json" in _one_line(e)


def test_check_sizes_accepts_real_configs(target):
    check_sizes(MedusaHeads.for_target(target).config.to_dict(), "x")
    check_sizes(EagleHead.for_target(target).config.to_dict(), "x")


# ---------------------------------------------------------------------------------------------- #12 generate


@pytest.fixture(scope="module")
def spec(target):
    return infer.SpecModel(target, MedusaHeads.for_target(target, num_heads=2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": -5}, r"max_new_tokens must be an int >= 0, got -5"),
        ({"max_new_tokens": 2.5}, r"max_new_tokens must be an int >= 0"),
        (
            {"eos_token_id": "</s>"},
            r"eos_token_id must be a token id .* in \[0, 95\], got '</s>' .*convert_tokens_to_ids",
        ),
        ({"eos_token_id": [2, 500]}, r"eos_token_id must be a token id .* in \[0, 95\], got 500"),
        ({"do_sample": True, "temperature": 0.0}, r"temperature must be a number > 0 when sampling, got 0.0"),
        ({"do_sample": True, "top_p": 1.5}, r"top_p must be a number in \(0, 1\], got 1.5"),
        ({"do_sample": True, "top_p": 0}, r"top_p must be a number in \(0, 1\]"),
        ({"do_sample": True, "top_k": -1}, r"top_k must be an int >= 0"),
        ({"do_sample": "yes"}, "do_sample must be True or False"),
        (
            {"acceptance": "typical", "do_sample": True, "typical_eps": 2.0},
            r"typical_eps must be a number in \[0, 1\]",
        ),
        ({"generator": 3}, "generator must be a torch.Generator"),
        (
            {"generation_config": {"max_new_tokens": 3}},
            "generation_config must be a transformers GenerationConfig",
        ),
        ({"streamer": object()}, r"streamer must have put\(\) and end\(\)"),
        ({"tree": [[0], [500]]}, r"tree: tree rank 500 is beyond the vocabulary; ranks must be in \[0, 95\]"),
        ({"tree": [[0]] * 1 + [[i] for i in range(1, 5000)]}, r"the tree has 5000 nodes"),
        (
            {"attention_mask": torch.ones(1, 2)},
            r"attention_mask must be a tensor of input_ids' shape \(1, 4\)",
        ),
    ],
)
def test_generate_arguments_are_checked(spec, kwargs, message):
    ids = torch.tensor([[3, 4, 5, 6]])
    with pytest.raises(ValueError, match=message) as e:
        infer.generate(spec, ids, **({"max_new_tokens": 4} | kwargs))
    _one_line(e)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (
            torch.tensor([[3, 96, 5]]),
            r"input_ids holds token id 96, outside the target's vocabulary \[0, 95\]",
        ),
        (torch.tensor([[3, -1]]), r"input_ids holds token id -1"),
        (
            torch.tensor([[3.0, 4.0]]),
            r"input_ids must hold integer token ids \(torch.long\), got dtype torch.float32",
        ),
        ([[3, 4]], r"input_ids must be a torch.Tensor"),
        (torch.tensor([[3, 4]])[:, :0], "empty prompt"),
    ],
)
def test_generate_prompt_is_checked(spec, ids, message):
    with pytest.raises(ValueError, match=message) as e:
        infer.generate(spec, ids, max_new_tokens=4)
    _one_line(e)


def test_generate_still_takes_the_edge_cases_that_are_valid(spec, target):
    ids = torch.tensor([3, 4, 5, 6], dtype=torch.int32)  # 1-D, int32: a batch of one
    ref = target.generate(ids[None].long(), attention_mask=torch.ones(1, 4, dtype=torch.long), max_new_tokens=5,
                          do_sample=False)  # fmt: skip
    assert (
        infer.generate(spec, ids, max_new_tokens=5, eos_token_id=torch.tensor([2])).sequences.tolist()
        == ref.tolist()
    )
    assert infer.generate(spec, ids[None], max_new_tokens=0).sequences.shape == (1, 4)


def test_eagle_budget_arguments_are_checked(target):
    m = infer.SpecModel(target, EagleHead.for_target(target))
    ids = torch.tensor([[3, 4, 5]])
    for kw, message in [({"depth": 4000}, r"generate: 'depth' must be an int in \[1, 64\], got 4000"),
                        ({"total_tokens": 1}, r"'total_tokens' must be an int in \[2, 4096\], got 1"),
                        ({"draft_top_k": 0.5}, r"'draft_top_k' must be an int in \[1, 1024\]")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            infer.generate(m, ids, max_new_tokens=3, **kw)


def test_load_arguments_are_checked(target, tmp_path):
    _medusa(target, tmp_path / "h")
    for kw, message in [({"target": 3}, "target must be a Hub id, a directory or a model, got 3"),
                        ({"heads": ""}, "heads must be a Hub id, a directory or heads"),
                        ({"device": "warp-drive"}, "device='warp-drive' is not a torch device"),
                        ({"allow_other_target": "yes"}, "allow_other_target= must be True or False")]:  # fmt: skip
        args = {"target": target, "heads": str(tmp_path / "h")} | kw
        with pytest.raises(ValueError, match=message):
            infer.load(**args)


# ---------------------------------------------------------------------------------------------- #13 target


def test_heads_refuse_another_target_of_the_same_sizes(target, tmp_path):
    heads = MedusaHeads.for_target(target, num_heads=2)
    heads.config.record_target(target)
    save_heads(heads, str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["target_architecture"] == "LlamaForCausalLM" and cfg["target_model_type"] == "llama"
    assert len(cfg["target_fingerprint"]["embed"]) == 32 and len(cfg["target_fingerprint"]["lm_head"]) == 32

    assert load_heads(str(tmp_path), target) is not None  # the same target
    assert load_heads(str(tmp_path), tiny_model("llama", dtype=torch.bfloat16)) is not None  # in bf16
    infer.SpecModel(target, heads)

    other_weights = tiny_model("llama", seed=5)  # same architecture and sizes, other weights
    mistral = tiny_model("mistral")  # another architecture of the same sizes
    for other, what in [
        (other_weights, r"its embed weights differ"),
        (mistral, r"architecture MistralForCausalLM"),
    ]:
        with pytest.raises(
            ValueError, match=f"trained on another target .*{what}.*allow_other_target=True"
        ) as e:
            infer.load(other, str(tmp_path))
        _one_line(e)
        with pytest.raises(ValueError, match="trained on another target"):
            infer.SpecModel(other, heads)
        with pytest.warns(UserWarning, match="trained on another target"):
            m = infer.load(other, str(tmp_path), allow_other_target=True)
        assert m.heads.config.num_heads == 2

    bad = tmp_path / "bad"  # a malformed record never matches (and never crashes the comparison)
    save_heads(heads, str(bad))
    _edit_config(bad, target_fingerprint={"embed": "x", "lm_head": [None]})
    with pytest.raises(ValueError, match="its embed weights differ .*its lm_head weights differ"):
        load_heads(str(bad), target)

    old = tmp_path / "old"  # heads saved before the fields existed load onto any target of their sizes
    save_heads(MedusaHeads.for_target(target, num_heads=2), str(old))
    cfg = json.loads((old / "config.json").read_text())
    for k in ("target_architecture", "target_model_type", "target_fingerprint"):
        cfg.pop(k)
    (old / "config.json").write_text(json.dumps(cfg))
    assert infer.load(other_weights, str(old)).heads.config.target_fingerprint is None
