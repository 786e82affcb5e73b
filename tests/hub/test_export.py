"""`minitx export`: stock Qwen3 / Llama / GPT-2 folders and GGUF files that give our logits and greedy tokens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import another_writer, second_writer

from hf_minitx import MiniTxConfig, MiniTxForCausalLM
from hf_minitx.cli import main as cli_main
from hf_minitx.data.tokenizer import train_bpe_tokenizer
from hf_minitx.folders import LOCK_FILE
from hf_minitx.hub.export import ExportRefused, main, mapping_problems

TEXTS = ["In the beginning was the word, and the word was with the tokenizer."] * 40
PROMPT = [[5, 17, 42, 99, 7, 123]]
ROTARY = dict(position_embedding_type="rope", norm_type="rmsnorm", hidden_act="swiglu")
# each target with the options that map onto it, the less common ones included
SOURCES = {
    "qwen3": ("qwen3", dict(ROTARY, qk_norm=True, attention_bias=False, num_key_value_heads=2,
                            tie_word_embeddings=False, scale_embeddings=True, rope_theta=5000.0)),
    "llama": ("llama", dict(ROTARY, attention_bias=True)),
    "gpt2-learned": ("gpt2", dict(position_embedding_type="learned")),
    "gpt2-sinusoidal": ("gpt2", dict(position_embedding_type="sinusoidal", hidden_act="relu2", num_key_value_heads=2,
                                     attention_bias=False, tie_word_embeddings=False)),
}
# Runs in a fresh interpreter that cannot import hf_minitx, without trust_remote_code: stock transformers only.
CLEAN_LOAD = """
import sys
sys.modules["hf_minitx"] = None
import json, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
results = {}
for folder in sys.argv[2:]:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor(json.loads(sys.argv[1]))
    with torch.no_grad():
        logits = model(ids).logits
    tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    results[folder] = {"class": type(model).__module__, "logits": logits.tolist(), "tokens": tokens.tolist(),
                       "encoded": tokenizer("the word was")["input_ids"]}
print("RESULT " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(TEXTS, 300)


def save_source(folder: Path, tokenizer, **overrides) -> MiniTxForCausalLM:
    """A randomly initialised model with every norm scale and bias moved off its start, saved with `tokenizer`."""
    torch.manual_seed(0)
    values = dict(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=96, max_position_embeddings=64, layer_norm_eps=1e-6)
    model = MiniTxForCausalLM(MiniTxConfig(**(values | overrides))).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def run_clean(folders: list[Path]) -> dict:
    """Load each folder with plain transformers in a child process that cannot import hf_minitx."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", CLEAN_LOAD, json.dumps(PROMPT), *map(str, folders)], env=env,
                          cwd=folders[0].parent, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("export")
    models, folders = {}, {}
    for name, (target, overrides) in SOURCES.items():
        models[name] = save_source(root / f"src-{name}", tokenizer, **overrides)
        folders[name] = main(["--model", str(root / f"src-{name}"), "--to", target, "--output_dir",
                              str(root / f"out-{name}")])
    return models, folders, run_clean(list(folders.values()))


@pytest.mark.parametrize("name", SOURCES)
def test_export_loads_without_hf_minitx_with_our_logits_and_tokens(exported, tokenizer, name):
    models, folders, results = exported
    result, model, target = results[str(folders[name])], models[name], SOURCES[name][0]
    assert result["class"] == f"transformers.models.{target}.modeling_{target}"
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        expected = model(ids).logits
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, rtol=1e-5, atol=1e-5)
    ours = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert result["tokens"] == ours.tolist()
    assert result["encoded"] == tokenizer("the word was")["input_ids"]


def test_export_writes_card_generation_config_and_marker(exported):
    _, folders, _ = exported
    folder = folders["qwen3"]
    card = (folder / "README.md").read_text()
    assert "base_model" not in card  # a local folder is no Hub repo id: named in the text only
    assert f"The hf_minitx model `{folder.parent / 'src-qwen3'}` exported" in card and "trust_remote_code" in card
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2 and generation["pad_token_id"] == 0
    assert json.loads((folder / ".minitx-run.json").read_text())["command"] == "export"


def test_a_config_that_does_not_map_is_refused_field_by_field(tmp_path, tokenizer, capsys):
    save_source(tmp_path / "src", tokenizer, hidden_act="relu2", norm_type="rmsnorm", qk_norm=True,
                final_logit_softcap=30.0)
    with pytest.raises(ExportRefused) as refused:
        main(["--model", str(tmp_path / "src"), "--to", "gpt2", "--output_dir", str(tmp_path / "out")])
    head, *lines = str(refused.value).splitlines()
    assert head == "the model does not map onto GPT-2 (3 fields to change):"
    assert lines == ["(1) norm_type rmsnorm: GPT-2 uses LayerNorm; train with --config_overrides norm_type=layernorm",
                     "(2) qk_norm true: GPT-2 has no QK-norm; train with --config_overrides qk_norm=false",
                     "(3) final_logit_softcap 30.0: GPT-2 does not cap its logits; train with --config_overrides "
                     "final_logit_softcap=None",  # and the one flag for all, as one --config_overrides takes them
                     "all at once: train with --config_overrides norm_type=layernorm,qk_norm=false,"
                     "final_logit_softcap=None"]
    assert cli_main(["export", "--model", str(tmp_path / "src"), "--to", "qwen3", "--output_dir",
                     str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "hidden_act relu2: Qwen3 uses swiglu; train with --config_overrides hidden_act=swiglu; (" in error
    assert "error: the model does not map onto Qwen3 (4 fields to change): (1) " in error and ":;" not in error
    assert error.count("error:") == 1 and not (tmp_path / "out").exists()


def test_a_quantized_folder_is_refused_in_one_line(tmp_path, tokenizer, capsys):
    """A folder saved from an int8 model (torchao) loads, but an export writes full precision: refused, naming why."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    save_source(tmp_path / "src", tokenizer, **SOURCES["qwen3"][1])
    quantized = MiniTxForCausalLM.from_pretrained(tmp_path / "src", quantization_config=TorchAoConfig(
        Int8WeightOnlyConfig()))
    quantized.save_pretrained(tmp_path / "q8")
    tokenizer.save_pretrained(tmp_path / "q8")
    capsys.readouterr()  # the saves' progress bars
    assert cli_main(["export", "--model", str(tmp_path / "q8"), "--to", "qwen3", "--output_dir",
                     str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {tmp_path / 'q8'} holds quantized weights (torchao): an export writes")
    assert len(error.splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["qwen3", "llama", "gpt2"])
def test_every_mismatch_names_its_field(target):
    config = MiniTxConfig(norm_position="post", scale_embeddings=True)
    problems = mapping_problems(config, target)
    fields = [line.split(" ", 1)[0] for line in problems]
    assert "norm_position" in fields and "scale_embeddings" in fields
    assert all("--config_overrides" in line for line in problems)
    assert mapping_problems(MiniTxConfig(is_encoder_decoder=True), target)[0].startswith("is_encoder_decoder true")


def test_a_gpt2_refusal_names_the_value_gpt2_takes_and_accepts_either_position_table():
    """GPT-2 takes a learned or sinusoidal position table and an ungated activation: rotary positions and SwiGLU
    are refused, each line naming the value that maps; a sinusoidal table is not refused."""
    problems = mapping_problems(MiniTxConfig(**{**ROTARY, "norm_type": "layernorm"}), "gpt2")
    by_field = {line.split(" ", 1)[0]: line for line in problems}
    assert set(by_field) == {"position_embedding_type", "hidden_act"}
    assert "GPT-2 adds a position table" in by_field["position_embedding_type"]
    assert by_field["position_embedding_type"].endswith("--config_overrides position_embedding_type=learned")
    assert by_field["hidden_act"].endswith("--config_overrides hidden_act=gelu")
    assert mapping_problems(MiniTxConfig(position_embedding_type="sinusoidal", hidden_act="relu2"), "gpt2") == []


def test_export_refuses_to_overwrite_unasked(exported, tmp_path):
    _, folders, _ = exported
    source = folders["llama"].parent / "src-llama"
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli_main(["export", "--model", str(source), "--to", "llama", "--output_dir", str(out)]) == 2
    assert (out / "notes.txt").read_text() == "mine"
    main(["--model", str(source), "--to", "llama", "--output_dir", str(folders["llama"]), "--overwrite"])
    assert (folders["llama"] / "model.safetensors").is_file()


def test_bad_target_is_refused_before_reading(tmp_path, capsys):
    assert cli_main(["export", "--model", str(tmp_path), "--to", "mistral", "--output_dir", str(tmp_path / "o")]) == 2
    assert "--to 'mistral' is not a target" in capsys.readouterr().err


# --- one writer per folder ------------------------------------------------------------------------------------


def test_an_export_into_a_folder_another_process_writes_is_refused_and_writes_nothing(tmp_path, tokenizer, capsys):
    save_source(tmp_path / "src", tokenizer, **ROTARY)
    out = tmp_path / "out"
    capsys.readouterr()  # what saving the source printed
    with another_writer(out / LOCK_FILE, pid=4242, host="box", command="export"):
        for target in ("qwen3", "gguf"):
            assert cli_main(["export", "--model", str(tmp_path / "src"), "--to", target, "--output_dir", str(out)]) == 2
            err = capsys.readouterr().err
            assert err == (f"error: --output_dir {out} is being written by `minitx export` (pid 4242 on box, lock "
                           f"{LOCK_FILE}); wait for it to finish or stop it, or choose another --output_dir\n"), err
            assert os.listdir(out) == [LOCK_FILE] and sorted(os.listdir(tmp_path)) == ["out", "src"]


@pytest.mark.slow
def test_two_exports_into_one_folder_one_is_refused_and_the_folder_holds_the_winners(tmp_path, tokenizer,
                                                                                     monkeypatch):
    """`--to gguf` writes; while it does, `--to qwen3` into the same folder runs in another process."""
    pytest.importorskip("gguf")
    from hf_minitx.hub import gguf_export

    save_source(tmp_path / "src", tokenizer, **ROTARY, qk_norm=True, attention_bias=False)
    out, write_gguf, second = tmp_path / "out", gguf_export.write_gguf, []

    def write_while_another_starts(*args, **kwargs):
        second.append(second_writer(["export", "--model", str(tmp_path / "src"), "--to", "qwen3", "--output_dir",
                                     str(out)]))
        return write_gguf(*args, **kwargs)

    monkeypatch.setattr(gguf_export, "write_gguf", write_while_another_starts)
    main(["--model", str(tmp_path / "src"), "--to", "gguf", "--output_dir", str(out)])
    assert second[0].returncode == 2 and second[0].stdout == "", second[0].stderr
    assert second[0].stderr == (f"error: --output_dir {out} is being written by `minitx export` (pid {os.getpid()} "
                                f"on {socket.gethostname()}, lock {LOCK_FILE}); wait for it to finish or stop it, or "
                                "choose another --output_dir\n")
    assert sorted(os.listdir(out)) == [".minitx-run.json", "README.md", "generation_config.json", "model-f32.gguf"]
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]


# --- GGUF --------------------------------------------------------------------------------------------------

GGUF_SOURCES = {  # transformers' GGUF reader takes Qwen3's head_dim as 128 (it reads no head size for qwen3)
    "qwen3": dict(ROTARY, qk_norm=True, attention_bias=False, hidden_size=256, num_attention_heads=2,
                  num_key_value_heads=1, tie_word_embeddings=False),
    "llama": dict(ROTARY, num_key_value_heads=2, rope_theta=500.0, attention_bias=False),
}


@pytest.mark.parametrize("architecture", GGUF_SOURCES)
@pytest.mark.parametrize("tensor_type", ["f32", "f16"])
def test_gguf_reads_back_with_our_logits(tmp_path, tokenizer, architecture, tensor_type):
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = save_source(tmp_path / "src", tokenizer, **GGUF_SOURCES[architecture])
    out = main(["--model", str(tmp_path / "src"), "--to", "gguf", "--gguf_type", tensor_type, "--output_dir",
                str(tmp_path / "gguf")])
    file_name = f"model-{tensor_type}.gguf"
    loaded = AutoModelForCausalLM.from_pretrained(out, gguf_file=file_name, dtype=torch.float32).eval()
    assert loaded.config.model_type == architecture
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        expected, found = model(ids).logits, loaded(ids).logits
    # f32 is the same numbers; f16 rounds each weight matrix to 11 significant bits
    tolerance = 1e-5 if tensor_type == "f32" else 2e-2
    torch.testing.assert_close(found, expected, rtol=0, atol=tolerance * max(1.0, expected.abs().max().item()))
    if tensor_type == "f32":
        ours = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
        assert loaded.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                               do_sample=False).tolist() == ours.tolist()
    gguf_tokenizer = AutoTokenizer.from_pretrained(out, gguf_file=file_name)
    text = "In the beginning was the word"
    assert gguf_tokenizer(text, add_special_tokens=False)["input_ids"] == tokenizer(text)["input_ids"]
    assert gguf_tokenizer.eos_token_id == tokenizer.eos_token_id
    # the reader leaves the generation settings behind; the folder's, as its card says, are the source model's
    from transformers import GenerationConfig

    card = (out / "README.md").read_text()
    assert "GenerationConfig.from_pretrained(folder)" in card
    assert ("logits to half precision's rounding" in card) == (tensor_type == "f16")  # f32: the same logits
    assert GenerationConfig.from_pretrained(out).to_dict() == model.generation_config.to_dict()


def test_gguf_refuses_a_gpt2_style_model_naming_the_fields(tmp_path, tokenizer):
    pytest.importorskip("gguf")
    save_source(tmp_path / "src", tokenizer)
    with pytest.raises(ExportRefused) as refused:
        main(["--model", str(tmp_path / "src"), "--to", "gguf", "--output_dir", str(tmp_path / "gguf")])
    lines = str(refused.value).splitlines()
    assert "position_embedding_type learned: Llama uses rotary positions" in lines[1]
    assert lines[-2].split(" ", 1)[1].startswith("attention_bias true: the llama GGUF form has no biases")
    assert lines[-1].startswith("all at once: train with --config_overrides position_embedding_type=rope,")
    assert [line.split(" ")[1] for line in lines[1:]].count("attention_bias") == 1  # each field said once


def test_a_seq2seq_model_is_refused_by_gguf_for_its_kind_alone(tmp_path, tokenizer):
    """An encoder-decoder maps onto no target: the refusal says so, with no field advice that could not help."""
    from hf_minitx import MiniTxForConditionalGeneration

    pytest.importorskip("gguf")
    MiniTxForConditionalGeneration(MiniTxConfig(is_encoder_decoder=True, vocab_size=len(tokenizer), hidden_size=32,
                                                num_hidden_layers=1, num_attention_heads=2, attention_bias=True,
                                                max_position_embeddings=32)).save_pretrained(tmp_path / "src")
    tokenizer.save_pretrained(tmp_path / "src")
    for target in ("gguf", "qwen3"):
        with pytest.raises(ExportRefused) as refused:
            main(["--model", str(tmp_path / "src"), "--to", target, "--output_dir", str(tmp_path / target)])
        lines = str(refused.value).splitlines()
        assert len(lines) == 2 and lines[1].startswith("(1) is_encoder_decoder true:"), lines
        assert not (tmp_path / target).exists()


def test_a_gguf_option_with_a_stock_target_is_refused_and_a_llama_gguf_names_the_qwen3_form(tmp_path, tokenizer):
    save_source(tmp_path / "src", tokenizer, **SOURCES["qwen3"][1])
    for option in (["--gguf_type", "f16"], ["--gguf_architecture", "llama"], ["--gguf_type", "f32"]):
        with pytest.raises(ValueError, match=f"{option[0]} applies to --to gguf, not --to qwen3"):
            main(["--model", str(tmp_path / "src"), "--to", "qwen3", *option, "--output_dir", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
    (qk_norm,) = [line for line in mapping_problems(MiniTxConfig(**ROTARY, qk_norm=True, attention_bias=False),
                                                    "llama") if line.startswith("qk_norm")]
    assert "--gguf_architecture qwen3" in qk_norm


def test_a_qwen3_refusal_suggests_llama_only_where_llama_would_take_the_model():
    with_qk_norm = mapping_problems(MiniTxConfig(qk_norm=True, attention_bias=True), "qwen3")
    bias = next(line for line in with_qk_norm if line.startswith("attention_bias"))
    assert "--to llama" not in bias and "--config_overrides attention_bias=false" in bias  # llama has no QK-norm
    bias = next(line for line in mapping_problems(MiniTxConfig(**ROTARY, qk_norm=False, attention_bias=True), "qwen3")
                if line.startswith("attention_bias"))
    assert "(export with --to llama)" in bias
    assert "Qwen3's feed-forward has no biases (attention_bias sets them here too)" in bias
    (qk_norm,) = [line for line in mapping_problems(MiniTxConfig(**ROTARY, qk_norm=True, attention_bias=True), "llama")
                  if line.startswith("qk_norm")]  # Qwen3 would refuse its biases too: not offered
    assert "--to qwen3" not in qk_norm and "--gguf_architecture" not in qk_norm


# --- the presets whose models export ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "targets"), [("qwen3-style", ("qwen3", "gguf")), ("gpt2-style", ("gpt2",)),
                                                 (None, ("qwen3", "gguf"))],
                         ids=["qwen3-style", "gpt2-style", "the-default-with-a-budget"])
def test_a_model_trained_with_an_exporting_preset_exports(tmp_path, preset, targets):
    """The presets that export, and what a run without --preset makes: the budget's shape in Qwen3's blocks."""
    from accelerate.state import AcceleratorState, GradientState
    from transformers import AutoModelForCausalLM

    from hf_minitx.inference import load_model_folder
    from hf_minitx.training.loop import main as train

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS * 5) + "\n")
    run = tmp_path / "run"
    length = ["--preset", preset, "--max_steps", "3"] if preset else ["--max_minutes", "0.05"]
    train(["--task", "causal-lm", "--dataset", str(corpus), *length, "--tokenizer_vocab_size", "300",
           "--block_size", "32", "--eval_steps", "0", "--max_eval_samples", "8",
           "--num_sample_generations", "0", "--disable_tqdm", "--num_threads", "1", "--output_dir", str(run)])
    model, _ = load_model_folder(run, device="cpu", dtype=torch.float32)
    if preset is None:
        assert json.loads((run / "training_summary.json").read_text())["shape_plan"]["chosen"]
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        expected = model(ids).logits
    for target in targets:
        out = main(["--model", str(run), "--to", target, "--output_dir", str(tmp_path / target)])
        # transformers' GGUF reader takes Qwen3's head size as 128 unless told: the card names the keyword
        head_dim = model.config.head_dim
        extra = {"gguf_file": "model-f32.gguf", "head_dim": head_dim} if target == "gguf" else {}
        if extra:
            assert f"gguf_file='model-f32.gguf', head_dim={head_dim})" in (out / "README.md").read_text()
        loaded = AutoModelForCausalLM.from_pretrained(out, **extra).eval()
        assert "minitx" not in type(loaded).__module__
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, expected, rtol=1e-5, atol=1e-5)
