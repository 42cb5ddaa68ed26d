import dataclasses, pytest
from heads import config

@dataclasses.dataclass
class Inner:
    lr: float = 1e-3
    def __post_init__(self):
        if self.lr <= 0: raise ValueError("inner.lr must be > 0")

@dataclasses.dataclass
class Opts:
    heads: list[str] = dataclasses.field(default_factory=list, metadata={"help": "heads dirs"})
    max_new_tokens: int = 128
    dtype: str | None = None
    merge: bool = False
    inner: Inner = dataclasses.field(default_factory=Inner)

def test_cli(tmp_path):
    o = config.parse_cli(Opts, ["--heads", "a=b", "c", "--heads", "d", "--max-new-tokens", "7", "--merge", "inner.lr=0.5"])
    assert o == Opts(heads=["a=b", "c", "d"], max_new_tokens=7, merge=True, inner=Inner(0.5))
    y = tmp_path / "r.yaml"; y.write_text("max_new_tokens: 9\ndtype: bf16\n")
    o = config.parse_cli(Opts, ["--config", str(y), "--dtype", "none"])
    assert o.max_new_tokens == 9 and o.dtype is None
    with pytest.raises(SystemExit):
        config.parse_cli(Opts, ["--max-new-tokens", "x"])
    with pytest.raises(SystemExit):
        config.parse_cli(Opts, ["inner.lr=-1"])
    with pytest.raises(SystemExit):
        config.parse_cli(Opts, ["inner.lrr=1"])
