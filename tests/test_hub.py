"""Hub round trip of head checkpoints (`heads.hub`): save/load for every head type, loading a Hub id from
an offline HF cache laid out as huggingface_hub lays it out, pushing (HfApi mocked at its methods), the
model card, the missing-token error, and the training-side push (`train.train_heads`)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import tiny_model

from heads import Eagle3Head, EagleHead, MedusaHeads, load_heads
from heads import hub as H
from heads.config import parse_cli
from heads.eagle3 import build_vocab_map

# ---------------------------------------------------------------------------------------------- helpers


def _randomize(module: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Non-trivial weights (Medusa's init is all zeros, so a round trip of it proves little)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return module


def _make_heads(kind: str, target) -> torch.nn.Module:
    if kind == "medusa":
        return _randomize(MedusaHeads.for_target(target, num_heads=3, num_layers=2))
    if kind == "eagle":
        return _randomize(EagleHead.for_target(target))
    head = _randomize(Eagle3Head.for_target(target, draft_vocab_size=40))
    counts = torch.arange(target.config.vocab_size).flip(0) % 7  # a non-identity draft vocab
    head.set_vocab_map(*build_vocab_map(counts, 40))
    return head


@pytest.fixture(scope="module")
def target(one_thread):
    return tiny_model("llama")


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    assert type(a) is type(b) and a.config == b.config
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def populate_cache(cache: str, repo_id: str, files: dict[str, bytes], commit: str, refs=("main",)) -> str:
    """Write ``files`` as revision ``commit`` of model ``repo_id`` in huggingface_hub's cache layout:
    ``models--org--name/blobs/<hash>`` (sha256 for LFS-sized weights, git sha1 otherwise),
    ``snapshots/<commit>/<path>`` -> relative symlinks to the blobs, ``refs/<name>`` holding the commit."""
    root = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    for sub in ("blobs", "refs", os.path.join("snapshots", commit)):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    for path, data in files.items():
        blob = hashlib.sha256(data).hexdigest() if path.endswith(".safetensors") else _git_blob_sha1(data)
        with open(os.path.join(root, "blobs", blob), "wb") as f:
            f.write(data)
        link = os.path.join(root, "snapshots", commit, path)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(os.path.join(root, "blobs", blob), os.path.dirname(link)), link)
    for ref in refs:
        with open(os.path.join(root, "refs", ref), "w") as f:
            f.write(commit)
    return os.path.join(root, "snapshots", commit)


def _dir_files(directory: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty HF cache under tmp_path, offline, used by every snapshot_download that passes no cache_dir."""
    from huggingface_hub import constants

    cache = str(tmp_path / "hf-cache")
    os.makedirs(cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", cache)
    return cache


@pytest.fixture
def no_token(tmp_path, monkeypatch):
    """No token anywhere huggingface_hub looks: env vars unset, token file path pointing nowhere."""
    from huggingface_hub import constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-stored-tokens"))


def checked_against(real):
    """A decorator: the fake's arguments must bind to ``real``'s signature (the installed huggingface_hub's
    HfApi method, read before it is replaced), so a call the real client would reject fails here too."""
    sig = inspect.signature(real)

    def wrap(fake):
        @functools.wraps(fake)
        def call(*args, **kw):
            try:
                sig.bind(*args, **kw)
            except TypeError as e:
                raise AssertionError(f"HfApi.{real.__name__}{sig} does not take this call: {e}") from None
            return fake(*args, **kw)

        return call

    return wrap


class FakeHfApi:
    """Records the calls that would reach the Hub: replaces only the HfApi methods a push uses
    (create_repo, create_branch, create_commit), and reads each file a commit would upload. huggingface_hub
    ships no local Hub its client could talk to, so the fake stays; each of its methods checks its call
    against the real method's signature (`checked_against`)."""

    def __init__(self, monkeypatch) -> None:
        from huggingface_hub import HfApi

        self.calls: list[tuple[str, dict]] = []
        self.uploaded: dict[str, bytes] = {}

        @checked_against(HfApi.create_repo)
        def create_repo(api, repo_id, **kw):
            self.calls.append(("create_repo", {"repo_id": repo_id, "token": api.token, **kw}))
            return SimpleNamespace(repo_id=repo_id)

        @checked_against(HfApi.create_branch)
        def create_branch(api, repo_id, **kw):
            self.calls.append(("create_branch", {"repo_id": repo_id, **kw}))

        @checked_against(HfApi.create_commit)
        def create_commit(api, repo_id, operations, **kw):
            files = {}
            for op in operations:  # a local file, or bytes (configs rewritten without local paths)
                with op.as_file() as f:
                    files[op.path_in_repo] = f.read()
            self.uploaded.update(files)
            self.calls.append(("create_commit", {"repo_id": repo_id, "files": sorted(files), **kw}))
            return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0")

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "create_branch", create_branch)
        monkeypatch.setattr(HfApi, "create_commit", create_commit)

    def commits(self) -> list[dict]:
        return [kw for name, kw in self.calls if name == "create_commit"]


@pytest.fixture
def fake_hub(monkeypatch):
    return FakeHfApi(monkeypatch)


def test_the_fake_hub_refuses_calls_the_real_client_would(fake_hub):
    """An argument the installed HfApi does not have, or a missing required one, fails the call."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(token="x")
    api.create_repo("u/r", private=True, exist_ok=True)
    with pytest.raises(AssertionError, match="create_repo"):
        api.create_repo("u/r", privat=True)  # a typo the real client would reject
    with pytest.raises(AssertionError, match="create_branch"):
        api.create_branch("u/r", branch_name="b")
    op = CommitOperationAdd(path_in_repo="a.txt", path_or_fileobj=b"a")
    api.create_commit("u/r", [op], commit_message="m")
    with pytest.raises(AssertionError, match="create_commit"):
        api.create_commit("u/r", [op])  # commit_message is required
    assert [name for name, _ in fake_hub.calls] == ["create_repo", "create_commit"]


# ---------------------------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_save_pretrained_from_pretrained_round_trip(kind, target, tmp_path):
    heads = _make_heads(kind, target)
    out = heads.save_pretrained(str(tmp_path / kind))
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors"]
    again = type(heads).from_pretrained(out, target=target)
    _assert_same(heads, again)
    _assert_same(heads, load_heads(out, target))  # the generic loader reads the same files
    if kind == "medusa":
        h = torch.randn(2, 5, target.config.hidden_size)
        lm = target.get_output_embeddings()
        assert torch.equal(heads(h, lm), again(h, lm))


def test_from_pretrained_rejects_another_head_type(target, tmp_path):
    out = _make_heads("eagle", target).save_pretrained(str(tmp_path / "e"))
    with pytest.raises(ValueError, match=r"holds 'eagle' heads, not 'medusa'.*EagleHead.from_pretrained"):
        MedusaHeads.from_pretrained(out)


# ---------------------------------------------------------------------------------------------- Hub id, offline


def test_load_by_hub_id_from_offline_cache_with_revisions(target, tmp_path, offline_cache):
    from huggingface_hub import scan_cache_dir

    old = _make_heads("medusa", target)
    new = _randomize(MedusaHeads.for_target(target, num_heads=3, num_layers=2), seed=2)
    c_old, c_new = "a" * 40, "b" * 40
    populate_cache(
        offline_cache, "org/heads", _dir_files(old.save_pretrained(str(tmp_path / "old"))), c_old, ("v1",)
    )
    populate_cache(offline_cache, "org/heads", _dir_files(new.save_pretrained(str(tmp_path / "new"))), c_new)
    info = scan_cache_dir(offline_cache)  # huggingface_hub itself reads the layout back
    assert not info.warnings and [r.repo_id for r in info.repos] == ["org/heads"]
    assert {rev.commit_hash for r in info.repos for rev in r.revisions} == {c_old, c_new}

    _assert_same(new, MedusaHeads.from_pretrained("org/heads", target=target))  # refs/main
    _assert_same(old, MedusaHeads.from_pretrained("org/heads", revision="v1", target=target))  # a tag
    _assert_same(old, MedusaHeads.from_pretrained("org/heads", revision=c_old))  # a commit
    _assert_same(new, load_heads("org/heads", target))  # infer.load's path: heads.base, default cache
    # an explicit cache_dir works without touching the default one
    other = str(tmp_path / "other-cache")
    populate_cache(other, "org/other", _dir_files(str(tmp_path / "old")), c_old)
    _assert_same(old, MedusaHeads.from_pretrained("org/other", cache_dir=other))


def test_offline_missing_repo_or_revision_is_a_clear_error(target, tmp_path, offline_cache):
    with pytest.raises(FileNotFoundError, match=r"heads 'org/nothing' are not in the Hugging Face cache"):
        MedusaHeads.from_pretrained("org/nothing")
    files = _dir_files(_make_heads("medusa", target).save_pretrained(str(tmp_path / "h")))
    populate_cache(offline_cache, "org/heads", files, "c" * 40)
    with pytest.raises(FileNotFoundError, match=r"at revision 'v9' are not in the Hugging Face cache"):
        MedusaHeads.from_pretrained("org/heads", revision="v9")
    with pytest.raises(FileNotFoundError, match="heads directory not found"):
        MedusaHeads.from_pretrained("./no/such/dir")
    with pytest.raises(ValueError, match="revision='v1' only applies to Hub ids"):
        MedusaHeads.from_pretrained(str(tmp_path / "h"), revision="v1")
    with pytest.raises(OSError, match="'org/nothing'"):  # infer.load's loader names the id too
        load_heads("org/nothing")


def test_cached_heads_for_another_base_model_or_head_type(target, tmp_path, offline_cache):
    other_target = tiny_model("llama", vocab_size=128, hidden_size=48)
    files = _dir_files(_make_heads("eagle", other_target).save_pretrained(str(tmp_path / "e")))
    populate_cache(offline_cache, "org/eagle-for-other", files, "d" * 40)
    with pytest.raises(ValueError, match=r"do not fit target .*vocab size 128 != target's 96"):
        EagleHead.from_pretrained("org/eagle-for-other", target=target)
    EagleHead.from_pretrained("org/eagle-for-other", target=other_target)  # the right target loads

    qwen = tiny_model("qwen2")  # same sizes, another architecture: EAGLE's draft layer is the target's
    files = _dir_files(_make_heads("eagle", target).save_pretrained(str(tmp_path / "e2")))
    populate_cache(offline_cache, "org/eagle-llama", files, "e" * 40)
    with pytest.raises(ValueError, match=r"trained for a 'llama' target .* architecture 'qwen2'"):
        EagleHead.from_pretrained("org/eagle-llama", target=qwen)

    # same shapes, another Hub base model: loads (the output is the target's own) with a warning
    heads = _make_heads("medusa", target)
    heads.config.base_model_name_or_path = "org/base-a"
    files = _dir_files(heads.save_pretrained(str(tmp_path / "m")))
    populate_cache(offline_cache, "org/medusa-a", files, "f" * 40)
    target.config._name_or_path, name = "org/base-b", target.config._name_or_path
    try:
        with pytest.warns(UserWarning, match="trained for 'org/base-a' but the target is 'org/base-b'"):
            MedusaHeads.from_pretrained("org/medusa-a", target=target)
    finally:
        target.config._name_or_path = name

    cfg = json.loads(files["config.json"])
    files["config.json"] = json.dumps(cfg | {"head_type": "hydra"}).encode()
    populate_cache(offline_cache, "org/hydra", files, "0" * 40)
    with pytest.raises(ValueError, match=r"unknown head_type 'hydra'; known: \['eagle', 'eagle3', 'medusa'"):
        MedusaHeads.from_pretrained("org/hydra")
    with pytest.raises(ValueError, match="unknown head_type 'hydra'"):
        load_heads("org/hydra")


# ---------------------------------------------------------------------------------------------- push


def test_push_to_hub_uploads_exactly_the_heads(target, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    heads = _make_heads("eagle3", target)
    ev = {"step": 7, "sim_accept_length": 1.5, "top1": [0.4, 0.2], "head_loss": [1.0, 2.0], "count": [9, 8]}
    heads.push_to_hub("org/eagle3-heads", private=True, eval_results=ev)
    (name, repo), (_, commit) = fake_hub.calls
    assert name == "create_repo"
    assert repo == {
        "repo_id": "org/eagle3-heads", "token": "hf_from_env", "private": True, "exist_ok": True, "repo_type": "model",
    }  # fmt: skip
    assert commit["repo_id"] == "org/eagle3-heads" and commit["files"] == [
        "README.md", "config.json", "eval_results.json", "model.safetensors",
    ]  # fmt: skip
    assert commit["revision"] is None and commit["create_pr"] is False
    card = fake_hub.uploaded["README.md"].decode()
    assert "org/eagle3-heads" in card and "1.500" in card
    from safetensors.torch import load as st_load

    state = st_load(fake_hub.uploaded["model.safetensors"])  # the heads' own tensors, no target weights
    assert state.keys() == heads.state_dict().keys() and not any("embed" in k for k in state)


def test_push_heads_dir_skips_training_state(target, tmp_path, fake_hub):
    out = tmp_path / "run"
    heads = _make_heads("medusa", target)
    heads.save_pretrained(str(out), model_card=False)
    for junk in ["checkpoints/step-10/model.safetensors", "checkpoints/step-10/optimizer.bin",
                 "best/model.safetensors", ".hub-staging/config.json", ".tmp-model.safetensors",
                 "optimizer.pt", "random_states_0.pkl", "metrics.jsonl"]:  # fmt: skip
        (out / junk).parent.mkdir(parents=True, exist_ok=True)
        (out / junk).write_bytes(b"x")
    (out / "train_config.yaml").write_text("data:\n  path: org/some-data\n  format: text\n")
    (out / "adapter").mkdir()
    (out / "adapter" / "adapter_config.json").write_text("{}")
    (out / "adapter" / "adapter_model.safetensors").write_bytes(b"y")
    H.push_heads_dir(str(out), "org/m", private=False, token="hf_x", revision="exp", commit_message="m1")
    assert [c[0] for c in fake_hub.calls] == ["create_repo", "create_branch", "create_commit"]
    assert fake_hub.calls[0][1]["private"] is False and fake_hub.calls[0][1]["token"] == "hf_x"
    assert fake_hub.calls[1][1] == {"repo_id": "org/m", "branch": "exp", "exist_ok": True}
    (commit,) = fake_hub.commits()
    assert commit["files"] == [
        "README.md", "adapter/adapter_config.json", "adapter/adapter_model.safetensors", "config.json",
        "model.safetensors", "train_config.yaml",
    ]  # fmt: skip
    assert commit["revision"] == "exp" and commit["commit_message"] == "m1"
    card = (out / "README.md").read_text()  # written because the directory had none
    assert "datasets:\n- org/some-data" in card and "under `adapter/`" in card

    with pytest.raises(
        FileNotFoundError, match=r"config.json is missing: .* is not a selfspec heads checkpoint"
    ):
        H.push_heads_dir(str(tmp_path), "org/m", token="hf_x")
    with pytest.raises(ValueError, match="Repo id"):
        H.push_heads_dir(str(out), "org/bad name!", token="hf_x")


def test_missing_token_on_push(target, tmp_path, no_token, fake_hub):
    heads = _make_heads("medusa", target)
    for push in (
        lambda: heads.push_to_hub("org/m"),
        lambda: H.push_heads_dir(heads.save_pretrained(str(tmp_path / "h")), "org/m"),
    ):
        with pytest.raises(
            H.MissingTokenError, match=r"needs a token: run `hf auth login`, set .*HF_TOKEN.*token="
        ):
            push()
    with pytest.raises(SystemExit, match="^error: pushing heads to the Hugging Face Hub .*needs a token"):
        H.push_command(
            parse_cli(H.PushOptions, ["push", str(tmp_path / "h"), "org/m"])
        )  # scripts/push_heads.py
    assert fake_hub.calls == []  # nothing reached the Hub
    heads.push_to_hub("org/m", token="hf_explicit")
    assert fake_hub.calls[0][1]["token"] == "hf_explicit"


# ---------------------------------------------------------------------------------------------- model card


def test_model_card_metadata_and_content(target, tmp_path):
    from huggingface_hub import ModelCard

    heads = _make_heads("medusa", target)
    heads.config.base_model_name_or_path = "org/base-model"
    ev = {
        "step": 20, "loss": 3.0, "sim_accept_length": 1.834, "top1": [0.61, 0.35, 0.2], "top5": [0.8, 0.6, 0.4],
        "head_loss": [2.1, 3.2, 4.4], "count": [100, 90, 80], "last": {"step": 30},
    }  # fmt: skip
    train_cfg = {"data": {"path": "org/chat-data", "format": "sharegpt", "max_length": 512, "eval_path": None},
                 "train": {"lr": 1e-3, "batch_size": 8, "grad_accum": 2, "max_steps": 30, "num_epochs": 1}}  # fmt: skip
    text = H.model_card_text(
        heads.config.to_dict(), eval_results=ev, train_config=train_cfg, repo_id="org/heads"
    )
    card = ModelCard(text)
    meta = card.data.to_dict()
    assert meta["base_model"] == "org/base-model" and meta["library_name"] == "selfspec"
    assert {"speculative-decoding", "medusa"} <= set(meta["tags"]) and meta["datasets"] == ["org/chat-data"]
    assert yaml.safe_load(text.split("---")[1]) == meta  # plain YAML front matter
    body = card.text
    assert (
        "| 0 | t+2 (draft token 1) | 61.0% | 80.0% | 2.100 | 100 |" in body
        and "| 2 | t+4 (draft token 3) | 20.0% | 40.0% | 4.400 | 80 |" in body
    )
    assert "τ = 1.834" in body and "counts the bonus token" in body
    assert 'infer.load("org/base-model", heads="org/heads")' in body and "infer.generate(model" in body
    assert (
        "`org/chat-data`" in body and "trained for 30 optimizer steps; these heads are from step 20" in body
    )
    assert "| `num_heads` | `3` |" in body and "PEFT adapter" not in body

    # a local base model is not valid Hub metadata: named in the text only
    heads.config.base_model_name_or_path = "/models/my-llama"
    card = ModelCard(H.model_card_text(heads.config.to_dict(), repo_id="org/heads"))
    assert "base_model" not in card.data.to_dict() and "`my-llama`" in card.text
    assert "/models" not in card.text  # a local absolute path never goes into a card (it is uploaded)

    # heads trained on a PEFT-adapted target: the card says the adapter is required, and why
    cfg = heads.config.to_dict() | {"target_adapter": "org/my-lora"}
    body = ModelCard(H.model_card_text(cfg, repo_id="org/heads")).text
    assert "require the PEFT adapter `org/my-lora`" in body and "changes the target's outputs" in body
    body = ModelCard(H.model_card_text(heads.config.to_dict() | {"target_adapter": "adapter"})).text
    assert "adapter stored with them (`adapter/`)" in body


# ---------------------------------------------------------------------------------------------- training


def _tiny_training(tmp_path):
    """The tiny target + data that tests/test_train.py uses, built here at a smaller size."""
    from test_train import _overrides, _text_row
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = str(tmp_path / "target")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [_text_row(i)["text"] for i in range(20)]
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    ))  # fmt: skip
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )).save_pretrained(path)  # fmt: skip
    data = str(tmp_path / "train.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    return path, data, _overrides


@pytest.mark.parametrize("strategy", ["end", "every_save"])
def test_training_pushes_at_the_end_or_at_each_save(
    strategy, tmp_path, fake_hub, monkeypatch, fresh_accelerate
):
    from train import train_heads
    from train.config import load_config

    monkeypatch.setenv("HF_TOKEN", "hf_train")
    tgt, data, overrides = _tiny_training(tmp_path)
    out = str(tmp_path / "run")
    extra = {"train.max_steps": 4, "train.save_every": 2, "train.eval_every": 2, "data.max_length": 24,
             "push_to_hub": "true", "hub_model_id": "org/run", "hub_private": "true", "hub_strategy": strategy}  # fmt: skip
    ev = train_heads.train(load_config(None, overrides(tgt, data, out, **extra)))
    commits = fake_hub.commits()
    heads_files = ["README.md", "config.json", "eval_results.json", "model.safetensors", "train_config.yaml"]
    no_eval = [
        f for f in heads_files if f != "eval_results.json"
    ]  # step 4's save comes before the final eval
    assert [c["files"] for c in commits] == (
        [heads_files, no_eval, heads_files] if strategy == "every_save" else [heads_files]
    )
    assert all(c["repo_id"] == "org/run" for c in commits)
    assert [kw["private"] for n, kw in fake_hub.calls if n == "create_repo"] == [True] * len(commits)
    if strategy == "every_save":
        assert [c["commit_message"] for c in commits[:2]] == [
            "medusa heads at step 2 (training)", "medusa heads at step 4 (training)",
        ]  # fmt: skip
        assert not os.path.exists(os.path.join(out, train_heads.HUB_STAGING))
    assert commits[-1]["commit_message"].startswith("medusa heads after 4 steps, τ ")
    assert commits[-1]["commit_message"].endswith(" measured, " + f"{ev['sim_accept_length']:.3f} simulated")
    # the final push is the saved output_dir; its card carries the eval
    assert fake_hub.uploaded["model.safetensors"] == open(os.path.join(out, "model.safetensors"), "rb").read()
    card = open(os.path.join(out, "README.md")).read()
    assert card == fake_hub.uploaded["README.md"].decode()
    assert f"τ = {ev['sim_accept_length']:.3f}" in card and 'heads="org/run"' in card


def test_training_pushes_from_the_main_process_only(tmp_path, fake_hub, monkeypatch):
    from train import train_heads
    from train.config import load_config

    monkeypatch.setenv("HF_TOKEN", "hf_train")
    out = _make_heads("medusa", tiny_model("llama")).save_pretrained(str(tmp_path / "h"))
    cfg = load_config(
        None,
        ["target.name_or_path=org/model", "data.path=org/data", "push_to_hub=true", "hub_model_id=org/run"],
    )
    waits = []
    for is_main in (False, True):
        run = SimpleNamespace(is_main=is_main, cfg=cfg, print=print, step=3)
        run.accelerator = SimpleNamespace(wait_for_everyone=lambda m=is_main: waits.append(m))
        train_heads.push_heads(run, out, "msg")
    assert [c["files"] for c in fake_hub.commits()] == [["README.md", "config.json", "model.safetensors"]]
    assert waits == [False, True]  # every process meets at the barrier; only the main one uploaded

    from huggingface_hub import HfApi

    def offline(*args, **kw):
        raise ConnectionError("no network")

    monkeypatch.setattr(HfApi, "create_commit", offline)
    train_heads.push_heads(run, out, "msg", fatal=False)  # at a checkpoint: reported, training goes on
    with pytest.raises(
        RuntimeError, match=r"no network\. They are saved in .*python scripts/push_heads.py push"
    ):
        train_heads.push_heads(run, out, "msg")  # at the end: the run fails, saying how to retry


def test_training_without_token_fails_at_start(tmp_path, no_token, fake_hub, fresh_accelerate, monkeypatch):
    from train import train_heads

    tgt, data, overrides = _tiny_training(tmp_path)
    fit_called = []
    monkeypatch.setattr(train_heads, "fit", lambda run: fit_called.append(run))
    args = overrides(tgt, data, str(tmp_path / "run"), push_to_hub="true", hub_model_id="org/run")
    with pytest.raises(
        SystemExit,
        match=r"error: pushing heads to the Hugging Face Hub \('org/run'\) needs a token: run `hf auth login`",
    ):
        train_heads.main(args)
    assert fit_called == [] and fake_hub.calls == []


def test_hub_config_keys_are_validated():
    from train.config import load_config

    cfg = load_config(
        None,
        [
            "target.name_or_path=org/model",
            "data.path=org/data",
            "push_to_hub=true",
            "hub_model_id=org/x",
            "hub_strategy=every_save",
        ],
    )
    assert (cfg.push_to_hub, cfg.hub_model_id, cfg.hub_private, cfg.hub_strategy) == (
        True,
        "org/x",
        None,
        "every_save",
    )
    with pytest.raises(ValueError, match="push_to_hub is true but hub_model_id is not set"):
        load_config(None, ["target.name_or_path=org/model", "data.path=org/data", "push_to_hub=true"])
    with pytest.raises(ValueError, match="hub_strategy must be one of end, every_save; got 'always'"):
        load_config(None, ["target.name_or_path=org/model", "data.path=org/data", "hub_strategy=always"])
    with pytest.raises(ValueError, match="hub_model_id 'org/a/b' is not a valid Hub repo id"):
        load_config(None, ["target.name_or_path=org/model", "data.path=org/data", "hub_model_id=org/a/b"])


def test_push_command_line_keeps_its_flags(tmp_path, capsys):
    """scripts/push_heads.py's command line: ``push DIR REPO_ID``, private unless --public, --revision,
    --commit-message; anything else is a one-line usage error."""
    opts = parse_cli(H.PushOptions, ["push", "d", "org/m"])
    assert (opts.directory, opts.repo_id, opts.private, opts.revision, opts.commit_message) == (
        "d",
        "org/m",
        True,
        None,
        None,
    )
    opts = parse_cli(
        H.PushOptions, ["push", "d", "org/m", "--public", "--revision", "v1", "--commit-message", "m"]
    )
    assert (opts.private, opts.revision, opts.commit_message) == (False, "v1", "m")
    assert parse_cli(H.PushOptions, ["push", "d", "org/m", "--private"]).private is True
    for argv, why in (
        (["pull", "d", "org/m"], "the command is 'push'"),
        (["push", "d"], "required"),
        (["push", "d", "org/m", "--private", "--public"], "not allowed with"),
    ):
        with pytest.raises(SystemExit):
            parse_cli(H.PushOptions, argv)
        assert why in capsys.readouterr().err
