"""save_pretrained / from_pretrained: exact tensors, tied weights stored once, dtypes, and remote code."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import tiny_config
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from hf_minitx import MiniTxForCausalLM, MiniTxForConditionalGeneration


def _model(kind, **overrides):
    torch.manual_seed(0)
    if kind == "causal":
        return MiniTxForCausalLM(tiny_config(**overrides)).eval()
    return MiniTxForConditionalGeneration(tiny_config(is_encoder_decoder=True, **overrides)).eval()


def _all_tensors(model):
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("kind,auto", [("causal", AutoModelForCausalLM), ("seq2seq", AutoModelForSeq2SeqLM)])
@pytest.mark.parametrize("pe", ["learned", "sinusoidal", "rope"])
def test_round_trip_restores_every_tensor_exactly(tmp_path, kind, auto, pe):
    model = _model(kind, position_embedding_type=pe)
    model.save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert {"config.json", "generation_config.json", "model.safetensors", "modeling_minitx.py",
            "configuration_minitx.py", "attention_minitx.py", "layers_minitx.py", "positions_minitx.py",
            "decoding_minitx.py", "cache_minitx.py", "checks_minitx.py", "lm_head_minitx.py"} <= files
    loaded = auto.from_pretrained(tmp_path)
    assert type(loaded) is type(model)
    before, after = _all_tensors(model), _all_tensors(loaded)
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert torch.equal(tensor, after[name]), name


def test_tied_weights_are_stored_once(tmp_path):
    for kind in ("causal", "seq2seq"):
        _model(kind).save_pretrained(tmp_path / kind)
        with safe_open(tmp_path / kind / "model.safetensors", "pt") as f:
            keys = set(f.keys())
        assert not any(k.startswith("lm_head") for k in keys)
        assert sum("embed_tokens" in k for k in keys) == 1
    _model("causal", tie_word_embeddings=False).save_pretrained(tmp_path / "untied")
    with safe_open(tmp_path / "untied" / "model.safetensors", "pt") as f:
        assert "lm_head.weight" in set(f.keys())


def test_auto_map_names_every_auto_class(tmp_path):
    _model("causal").save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map["AutoConfig"] == "configuration_minitx.MiniTxConfig"
    assert auto_map["AutoModel"] == "modeling_minitx.MiniTxModel"
    assert auto_map["AutoModelForCausalLM"] == "modeling_minitx.MiniTxForCausalLM"
    assert auto_map["AutoModelForSeq2SeqLM"] == "modeling_minitx.MiniTxForConditionalGeneration"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_loading_in_half_precision_runs_and_generates(tmp_path, dtype):
    for kind, auto in (("causal", AutoModelForCausalLM), ("seq2seq", AutoModelForSeq2SeqLM)):
        _model(kind, position_embedding_type="sinusoidal").save_pretrained(tmp_path / kind)
        model = auto.from_pretrained(tmp_path / kind, dtype=dtype)
        assert model.dtype == dtype
        ids = torch.randint(3, 64, (2, 5))
        extra = {"decoder_input_ids": ids} if kind == "seq2seq" else {}
        assert model(ids, **extra).logits.dtype == dtype
        out = model.generate(ids, do_sample=False, max_new_tokens=4, min_new_tokens=4)
        assert out.shape[1] >= 4


def test_wrong_auto_class_fails_with_a_clear_message(tmp_path):
    _model("seq2seq").save_pretrained(tmp_path / "s2s")
    _model("causal").save_pretrained(tmp_path / "lm")
    with pytest.raises(ValueError, match="AutoModelForSeq2SeqLM"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "s2s")
    with pytest.raises(ValueError, match="AutoModelForCausalLM"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "lm")


CLEAN_ENV_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_minitx"] = None  # make `import hf_minitx` fail: only the folder's own code may be used
    import torch
    from transformers import AutoConfig, AutoModel, {auto}
    folder, ids = sys.argv[1], json.loads(sys.argv[2])
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    model = {auto}.from_pretrained(folder, trust_remote_code=True).eval()
    base = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert "hf_minitx" not in type(model).__module__, type(model).__module__
    out = model.generate(torch.tensor(ids), do_sample=False, max_new_tokens=6, min_new_tokens=6)
    print(json.dumps({{"config": type(config).__name__, "model": type(model).__name__,
                       "base": type(base).__name__, "tokens": out.tolist()}}))
    """
)


def run_without_hf_minitx(script: str, args: list[str], tmp_path) -> dict:
    """Run `script` in a fresh interpreter that cannot import hf_minitx (no PYTHONPATH, the script blocks the
    installed package itself; a fresh modules cache); return the JSON of its last output line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    result = subprocess.run([sys.executable, "-c", script, *args], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("kind,auto", [("causal", "AutoModelForCausalLM"), ("seq2seq", "AutoModelForSeq2SeqLM")])
def test_folder_loads_and_generates_without_hf_minitx_installed(tmp_path, kind, auto):
    model = _model(kind, position_embedding_type="rope")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    ids = torch.randint(3, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    expected = model.generate(ids, do_sample=False, max_new_tokens=6, min_new_tokens=6).tolist()
    report = run_without_hf_minitx(CLEAN_ENV_SCRIPT.format(auto=auto), [str(folder), json.dumps(ids.tolist())],
                                   tmp_path)
    assert report["config"] == "MiniTxConfig" and report["model"] == type(model).__name__
    assert report["base"] == "MiniTxModel"
    assert report["tokens"] == expected


def test_device_map_and_to_device_keep_every_tensor_on_that_device(tmp_path):
    _model("seq2seq", position_embedding_type="sinusoidal").save_pretrained(tmp_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, device_map="cpu")
    assert {t.device.type for t in _all_tensors(model).values()} == {"cpu"}
    model = model.to(torch.bfloat16)
    assert {t.dtype for t in _all_tensors(model).values() if t.is_floating_point()} == {torch.bfloat16}
    ids = torch.randint(3, 64, (1, 4))
    assert model.generate(ids, do_sample=False, max_new_tokens=3, min_new_tokens=3).shape == (1, 4)


@pytest.mark.parametrize("kind,auto", [("causal", AutoModelForCausalLM), ("seq2seq", AutoModelForSeq2SeqLM)])
def test_extra_config_attributes_set_by_code_save_and_load(tmp_path, kind, auto):
    model = _model(kind)
    model.config.hidden_sizes = [64]  # close to hidden_size: a near-miss name, set on purpose
    model.config.layer_norm_epsilon = 1.0  # close to layer_norm_eps
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["hidden_sizes"] == [64] and saved["layer_norm_epsilon"] == 1.0
    loaded = auto.from_pretrained(tmp_path)
    assert loaded.config.hidden_sizes == [64] and loaded.config.layer_norm_epsilon == 1.0
    assert loaded.config.layer_norm_eps == model.config.layer_norm_eps  # the real field is untouched
    assert torch.equal(loaded(**_batch(kind)).logits, model(**_batch(kind)).logits)


def _batch(kind) -> dict:
    ids = torch.randint(3, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "decoder_input_ids": ids} if kind == "seq2seq" else {"input_ids": ids}
