"""k4.Config from a Hugging Face config.json (golden/inputs/hf_config.hpp), and k4.Weights /
k4.golden from a checkpoint in a release's layout, as `k4 golden --checkpoint` reads them:
the same config, the same layer, the same golden bytes, the same messages."""
import json
import shutil
import subprocess

import numpy as np
import pytest

import k4
from conftest import cli


@pytest.fixture(scope="module", params=["bf16", "mxfp4"])
def release(request, tmp_path_factory, k4_bin):
    """`k4 synth --layout L --size small`: hidden 2048, 8 experts, tp 2, layers 0..4 (K4: 3, 4)."""
    d = tmp_path_factory.mktemp("ckpt") / request.param
    r = cli(k4_bin, "synth", "--layout", request.param, "--size", "small", "--out", d)
    assert r.returncode == 0, r.stderr
    return d


def test_config_from_the_release_config_json(release):
    cfg = k4.Config.from_hf_config(release)
    tc = json.loads((release / "config.json").read_text())["text_config"]
    assert cfg.hidden == tc["hidden_size"] == 2048
    assert cfg.tp == tc["num_attention_heads"] // 16 == 2
    assert cfg.heads == 16 and cfg.head_dim == tc["head_dim"]
    assert cfg.n_routed == tc["num_local_experts"] and cfg.top_k == tc["num_experts_per_tok"]
    assert cfg.inter == tc["intermediate_size"] // cfg.tp
    assert cfg.route_scale == tc["routed_scaling_factor"] and cfg.swiglu_limit == tc["swiglu_limit"]
    assert cfg.eps == float(np.float32(tc["rms_norm_eps"]))  # a float in the config
    assert cfg.topk_blocks == tc["sparse_attention_config"]["sparse_topk_blocks"]
    assert cfg.sparse_block == tc["sparse_attention_config"]["sparse_block_size"]
    cfg.validate()
    # the file itself, and another TP
    assert k4.Config.from_hf_config(release / "config.json") == cfg
    assert k4.Config.from_hf_config(release, tp=2) == cfg  # 32 heads: 16 a rank only at tp 2
    m = k4.hf_model(release)
    assert m["config"] == cfg and m["num_layers"] == 5 and m["k4_layers"] == [3, 4]


def test_weights_and_golden_are_the_cli_s(release, tmp_path, k4_bin):
    """k4.golden(checkpoint=DIR) == k4 golden --checkpoint DIR (cmp), the layer the CLI's."""
    w = k4.Weights.from_checkpoint(release)
    assert w.config == k4.Config.from_hf_config(release)
    assert w.layer == 3 and "ptpc-fp8-vllm" in w.weight_prep
    opts = dict(tokens=2, context="1000,short")
    k4.run(w, k4.inputs(w, seed=4, **opts)).save(tmp_path / "py.h5")
    r = cli(k4_bin, "golden", "--checkpoint", release, "--seed", 4, "--tokens", 2, "--context", "1000,short",
            "--out", tmp_path / "cli.h5")
    assert r.returncode == 0, r.stderr
    assert subprocess.run(["cmp", tmp_path / "py.h5", tmp_path / "cli.h5"]).returncode == 0
    # layer 4, the floor rule, a variant: k4.golden with the CLI's options
    k4.golden(checkpoint=release, layer=4, mx_scale="floor", variant="split.kv_scale=static448", seed=4, **opts).save(tmp_path / "py4.h5")
    r = cli(k4_bin, "golden", "--checkpoint", release, "--layer", 4, "--mx-scale", "floor", "--variant", "split.kv_scale=static448",
            "--seed", 4, "--tokens", 2, "--context", "1000,short", "--out", tmp_path / "cli4.h5")
    assert r.returncode == 0, r.stderr
    assert subprocess.run(["cmp", tmp_path / "py4.h5", tmp_path / "cli4.h5"]).returncode == 0
    assert subprocess.run(["cmp", "-s", tmp_path / "py4.h5", tmp_path / "py.h5"]).returncode != 0


def broken(release, tmp_path, edit):
    """A copy of the release's config.json and index (the shards are not read before the shape
    is checked) with edit(tc) applied to its text_config."""
    d = tmp_path / "broken"
    d.mkdir()
    shutil.copy(release / "model.safetensors.index.json", d)
    j = json.loads((release / "config.json").read_text())
    edit(j["text_config"])
    (d / "config.json").write_text(json.dumps(j))
    return d


EDITS = {
    "swiglu_alpha": lambda tc: tc.update(swiglu_alpha=1.5),
    "heads": lambda tc: tc.update(num_attention_heads=24),
    "missing_hidden": lambda tc: tc.pop("hidden_size"),
    "scoring": lambda tc: tc.update(scoring_func="softmax"),
    "shared_inter": lambda tc: tc.update(shared_intermediate_size=512),
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_bad_config_json_gives_the_cli_s_message(edit, release, tmp_path, k4_bin):
    full = d = broken(release, tmp_path, EDITS[edit])
    r = cli(k4_bin, "golden", "--checkpoint", full, "--tokens", 1, "--out", tmp_path / "x.h5")
    assert r.returncode == 2 and not (tmp_path / "x.h5").exists()
    with pytest.raises(ValueError) as e:
        k4.Config.from_hf_config(full)
    assert str(e.value) in r.stderr, (str(e.value), r.stderr)
    assert f"checkpoint {full}: config.json" in str(e.value)
    with pytest.raises(ValueError) as e2:
        k4.Weights.from_checkpoint(full)
    assert str(e2.value) == str(e.value)
    with pytest.raises(ValueError) as e3:  # the file by its path: the same rule, the file named
        k4.Config.from_hf_config(d / "config.json")
    assert str(e3.value).startswith(f"config.json {d / 'config.json'}")
    assert str(e3.value).split(": ", 1)[1] == str(e.value).split("config.json: ", 1)[1]


def test_a_config_that_disagrees_and_a_missing_file(release, tmp_path, k4_bin):
    r = cli(k4_bin, "golden", "--checkpoint", release, "--preset", "tiny", "--tokens", 1, "--out", tmp_path / "x.h5")
    assert r.returncode == 2
    with pytest.raises(ValueError) as e:
        k4.Weights.from_checkpoint(release, k4.Config.preset("tiny"))
    assert str(e.value) in r.stderr and "disagrees with --preset tiny" in str(e.value)
    r = cli(k4_bin, "golden", "--checkpoint", release, "--tp", 3, "--tokens", 1, "--out", tmp_path / "x.h5")
    assert r.returncode == 2
    with pytest.raises(ValueError) as e:
        k4.Config.from_hf_config(release, tp=3)
    assert str(e.value) in r.stderr
    with pytest.raises(ValueError, match="no such file"):
        k4.Config.from_hf_config(tmp_path / "nothing.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"checkpoint {empty} has no config.json"):
        k4.Config.from_hf_config(empty)
    with pytest.raises(ValueError, match="is not valid JSON|not JSON"):
        (tmp_path / "bad.json").write_text("{")
        k4.Config.from_hf_config(tmp_path / "bad.json")


def test_the_mxfp8_release_under_its_variant(tmp_path_factory, tmp_path, k4_bin):
    """MiniMax-M3-MXFP8's layout: refused by the seed build with the CLI's message, read as
    stored under moe.experts = mxfp8, the CLI's bytes."""
    d = tmp_path_factory.mktemp("ckpt8") / "mxfp8"
    r = cli(k4_bin, "synth", "--layout", "mxfp8", "--size", "small", "--out", d)
    assert r.returncode == 0, r.stderr
    r = cli(k4_bin, "golden", "--checkpoint", d, "--tokens", 2, "--out", tmp_path / "x.h5")
    assert r.returncode == 2
    with pytest.raises(ValueError) as e:
        k4.Weights.from_checkpoint(d)
    assert str(e.value) in r.stderr and "moe.experts=mxfp8" in str(e.value)
    k4.golden(checkpoint=d, variant="moe.experts=mxfp8", seed=2, tokens=2, context="1000,short").save(tmp_path / "py.h5")
    r = cli(k4_bin, "golden", "--checkpoint", d, "--variant", "moe.experts=mxfp8", "--seed", 2, "--tokens", 2,
            "--context", "1000,short", "--out", tmp_path / "cli.h5")
    assert r.returncode == 0, r.stderr
    assert subprocess.run(["cmp", tmp_path / "py.h5", tmp_path / "cli.h5"]).returncode == 0
    w = k4.Weights.from_checkpoint(d, _with_variant(k4.Config.from_hf_config(d), "moe.experts=mxfp8"))
    assert "mxfp8-stored" in w.weight_prep and w.config.variant == k4.golden(
        checkpoint=d, variant="moe.experts=mxfp8", tokens=1).config.variant


def _with_variant(cfg, v):
    cfg.variant = v
    cfg.validate()
    return cfg
