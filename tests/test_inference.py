"""The one loader of saved folders refuses anything that is not exactly a MiniTx model (it never hands back a
half-random model), and generation settings are checked before any work."""

import copy
import json
import re
import shutil
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_minitx import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration, inference
from hf_minitx.cli import main as minitx
from hf_minitx.data import train_bpe_tokenizer
from hf_minitx.inference import generate, load_model_folder

TEXTS = [f"line {i}: the cat sat on the mat and looked at {i} birds." for i in range(60)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(TEXTS, 300)


def _save(model, tokenizer, folder):
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    config = MiniTxConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=32, position_embedding_type="learned",
                          pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return _save(MiniTxForCausalLM(config), tokenizer, tmp_path_factory.mktemp("causal") / "model")


@pytest.fixture
def broken(causal_dir, tmp_path):
    """A fresh copy of the good folder to break."""
    return shutil.copytree(causal_dir, tmp_path / "broken")


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_good_folder_loads_every_weight(causal_dir):
    model, tokenizer = load_model_folder(causal_dir, device="cpu")
    saved = load_file(causal_dir / "model.safetensors")
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in saved.items())
    assert tokenizer is not None


def test_other_model_type_is_not_a_minitx_folder(broken):
    _edit_config(broken, model_type="gpt2")
    with pytest.raises(ValueError, match="is not a MiniTx folder: config.json has model_type 'gpt2'"):
        load_model_folder(broken)
    _edit_config(broken, model_type="no-such-model")
    with pytest.raises(ValueError, match="not a MiniTx folder"):
        load_model_folder(broken)


def test_extra_layer_in_config_is_refused_not_initialised_at_random(broken):
    _edit_config(broken, num_hidden_layers=3)
    with pytest.raises(ValueError, match=r"does not match .*config.json: \d+ missing \(model.decoder.layers.2"):
        load_model_folder(broken)


def test_deleted_tensor_is_refused(broken):
    weights = load_file(broken / "model.safetensors")
    weights.pop("model.decoder.layers.0.mlp.fc1.weight")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="1 missing .*layers.0.mlp.fc1.weight"):
        load_model_folder(broken)


def test_unexpected_and_misshapen_tensors_are_refused(broken):
    weights = load_file(broken / "model.safetensors")
    weights["model.decoder.layers.0.self_attn.q_proj.weight"] = torch.zeros(8, 32)
    weights["stray.weight"] = torch.zeros(2)
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"1 unexpected \(stray.weight\); 1 mismatched \(.*q_proj.weight\)"):
        load_model_folder(broken)


@pytest.mark.parametrize("content", [b"", b"\x00" * 5, b"garbage that is not safetensors" * 3])
def test_corrupt_weights_name_the_file(broken, content):
    (broken / "model.safetensors").write_bytes(content)
    with pytest.raises(ValueError, match=r"model.safetensors is (truncated|corrupted)"):
        load_model_folder(broken)


def test_truncated_weights_name_the_file(broken):
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model.safetensors is truncated"):
        load_model_folder(broken)


def test_generate_command_refuses_a_broken_folder_with_one_line(broken, capsys):
    _edit_config(broken, num_hidden_layers=3)
    assert minitx(["generate", "--model", str(broken), "--prompt", "the cat"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "does not match" in err[0]


def test_a_model_with_a_nan_weight_is_refused_naming_the_tensor(broken, capsys):
    weights = load_file(broken / "model.safetensors")
    weights["model.decoder.layers.0.mlp.fc1.weight"][3, 4] = float("inf")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    assert minitx(["generate", "--model", str(broken), "--prompt", "the cat", "--do_sample"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 non-finite value(s) (NaN or inf) in model.decoder.layers.0.mlp.fc1.weight" in err[0]


@pytest.mark.parametrize("style", [["--do_sample"], ["--greedy"], ["--num_beams", "2"]])
def test_a_model_whose_finite_weights_overflow_is_refused_when_generating(broken, capsys, style):
    weights = load_file(broken / "model.safetensors")
    weights["model.decoder.norm.weight"].fill_(3e38)  # finite, but the logits overflow to inf and NaN
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    assert minitx(["generate", "--model", str(broken), "--prompt", "the cat", *style]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the model's outputs hold NaN or inf values" in err[0] and "earlier checkpoint" in err[0]


def test_top_k_filtering_is_not_taken_for_non_finite_outputs(causal_dir):
    model, tokenizer = load_model_folder(causal_dir, device="cpu")
    (text,) = generate(model, tokenizer, ["the cat"], do_sample=True, top_k=1, top_p=0.5, max_new_tokens=4)
    assert isinstance(text, str)


def test_dry_run_names_a_broken_folder_not_the_remote_code(broken, tmp_path, capsys):
    _edit_config(broken, num_hidden_layers=3)
    assert minitx(["push", "--model_dir", str(broken), "--dry_run", str(tmp_path / "staged")]) == 2
    err = capsys.readouterr().err
    assert "does not match" in err and "without hf_minitx" not in err
    assert not (tmp_path / "staged").exists()


@pytest.mark.parametrize("setting,message", [
    ({"top_p": 1.5}, "top_p must be in"), ({"top_p": 0.0}, "top_p must be in"), ({"top_k": -1}, "top_k must be"),
    ({"temperature": 0.0}, "temperature must be"), ({"num_beams": 0}, "num_beams must be"),
    ({"max_new_tokens": 0}, "max_new_tokens must be"),
])
def test_generation_settings_out_of_range_are_refused(causal_dir, setting, message):
    model, tokenizer = load_model_folder(causal_dir, device="cpu")
    with pytest.raises(ValueError, match=message):
        generate(model, tokenizer, ["the cat"], **setting)


def test_generation_longer_than_the_positions_says_how_many_fit(causal_dir):
    model, tokenizer = load_model_folder(causal_dir, device="cpu")
    prompt_len = len(tokenizer("the cat", add_special_tokens=False)["input_ids"])
    fit = 32 + 1 - prompt_len  # the last new token takes no position: generate()'s own check allows as many
    for asked in (10_000, fit + 1):
        with pytest.raises(ValueError, match=f"at most {fit} new tokens fit"):
            generate(model, tokenizer, ["the cat"], max_new_tokens=asked)
    output = generate(model, tokenizer, ["the cat"], max_new_tokens=fit, do_sample=False, min_new_tokens=fit)
    assert len(tokenizer(output[0], add_special_tokens=False)["input_ids"]) >= fit - 2  # it ran to the end
    with pytest.raises(ValueError, match=f"max_new_tokens={fit + 1}.* at most {fit} new tokens fit"):
        model.generate(**tokenizer(["the cat"], return_tensors="pt"), max_new_tokens=fit + 1)
    model.generate(**tokenizer(["the cat"], return_tensors="pt"), max_new_tokens=fit)  # the CLI's limit is generate()'s


def test_rotary_generation_past_the_trained_context_is_refused_in_the_cli_and_warned_in_python(
        tokenizer, tmp_path, capsys, caplog):
    torch.manual_seed(0)
    config = MiniTxConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=16, position_embedding_type="rope",
                          pad_token_id=0, bos_token_id=1, eos_token_id=2)
    folder = _save(MiniTxForCausalLM(config), tokenizer, tmp_path / "rotary")
    capsys.readouterr()  # the save's progress bar
    assert minitx(["generate", "--model", str(folder), "--prompt", "the cat", "--max_new_tokens", "100000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_new_tokens=100000 does not fit: the model has 16 positions (rope)" in err[0]
    model, _ = load_model_folder(folder, device="cpu")
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.enable_propagation()
    with caplog.at_level(logging.WARNING):
        assert len(generate(model, tokenizer, ["the cat"], max_new_tokens=20, do_sample=False)) == 1
    assert "will exceed the model's predefined maximum length (16" in caplog.text
    caplog.clear()
    short = copy.deepcopy(tokenizer)  # a tokenizer that knows the 16 positions warns of any longer text itself
    short.model_max_length = 16
    short.save_pretrained(folder)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):  # a prompt past the context: one message, ours
        assert minitx(["generate", "--model", str(folder), "--prompt", "the cat " * 20, "--max_new_tokens", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shorten the prompt" in err[0] and "Token indices sequence length" not in caplog.text


def test_seq2seq_generation_longer_than_the_decoder_positions_is_refused(tokenizer, tmp_path):
    config = MiniTxConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=16, is_encoder_decoder=True,
                          position_embedding_type="sinusoidal", pad_token_id=0, bos_token_id=1, eos_token_id=2,
                          decoder_start_token_id=1)
    folder = _save(MiniTxForConditionalGeneration(config), tokenizer, tmp_path / "s2s")
    model, tok = load_model_folder(folder, device="cpu")
    with pytest.raises(ValueError, match="the decoder's start takes 1, so at most 16 new tokens fit"):
        generate(model, tok, ["the cat"], max_new_tokens=40)


@pytest.mark.parametrize("positions", ["sinusoidal", "rope"])
def test_a_source_longer_than_the_encoder_positions_is_named(tokenizer, tmp_path, positions, caplog, capsys):
    config = MiniTxConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=16, is_encoder_decoder=True,
                          position_embedding_type=positions, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                          decoder_start_token_id=1)
    model, tok = load_model_folder(_save(MiniTxForConditionalGeneration(config), tokenizer, tmp_path / "s2s"),
                                   device="cpu")
    long = "the cat sat on the mat " * 10
    said = rf"prompt 1 takes \d+ tokens and the encoder has 16 positions \({positions}\)"
    with pytest.raises(ValueError, match=said + "; shorten it"):  # the CLI refuses, whatever the positions
        generate(model, tok, ["the cat", long], max_new_tokens=2, refuse_past_training=True)
    folder = tmp_path / "s2s"  # `minitx generate` refuses it whatever --max_new_tokens says, or without it
    assert minitx(["generate", "--model", str(folder), "--prompt", "the cat", long]) == 2
    assert re.search(said + "; shorten it", capsys.readouterr().err)
    if positions == "rope":  # in Python, past the trained context is warned about, as transformers does
        assert len(generate(model, tok, ["the cat", long], max_new_tokens=2)) == 2
        assert re.search(said + ", the context it was trained on", caplog.text)
    else:  # a table has no row past its end
        with pytest.raises(ValueError, match=said):
            generate(model, tok, ["the cat", long], max_new_tokens=2)


def test_empty_prompt_is_refused(causal_dir):
    model, tokenizer = load_model_folder(causal_dir, device="cpu")
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        generate(model, tokenizer, [""])
    with pytest.raises(ValueError, match="prompt 1 is empty"):  # padding must not stand in for a prompt
        generate(model, tokenizer, ["the cat", ""])


def test_an_empty_source_is_refused_by_a_translation_model_too(tokenizer, tmp_path):
    config = MiniTxConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=16, is_encoder_decoder=True,
                          pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    model, tok = load_model_folder(_save(MiniTxForConditionalGeneration(config), tokenizer, tmp_path / "s2s"),
                                   device="cpu")
    with pytest.raises(ValueError, match="prompt 1 is empty; give every prompt some text to translate"):
        generate(model, tok, ["the cat", " "], max_new_tokens=2)


@pytest.mark.parametrize("extra, said", [
    (["--top_p", "0.5"], "--greedy does not sample, so --top_p would do nothing; drop it or --greedy"),
    (["--temperature", "0.7", "--top_k", "5"], "so --temperature, --top_k would do nothing; drop them or --greedy"),
    (["--temperature", "nan"], "temperature must be > 0 and finite, got nan"),  # transformers' words before
    (["--temperature", "inf"], "temperature must be > 0 and finite, got inf"),  # sampled uniformly before
    (["--num_beams", "100000"], "num_beams must be at most the vocabulary size"),  # took 11 GB before
])
def test_sampling_settings_beside_greedy_are_refused_not_ignored(causal_dir, capsys, extra, said):
    greedy = ["--greedy"] if "would do nothing" in said else []
    assert minitx(["generate", "--model", str(causal_dir), "--prompt", "the cat", *greedy, *extra]) == 2
    assert said in capsys.readouterr().err


def test_do_sample_false_decodes_greedily(causal_dir, capsys):
    """`--do_sample false` was read as "not given" and the model's generation_config sampled anyway."""
    with mock.patch.object(inference, "generate", return_value=["x"]) as run:
        inference.main(["--model", str(causal_dir), "--prompt", "the cat", "--do_sample", "false"])
    assert run.call_args.kwargs["do_sample"] is False
    argv = ["generate", "--model", str(causal_dir), "--prompt", "the cat", "--do_sample", "false", "--top_k", "5"]
    assert minitx(argv) == 2
    assert "--do_sample false does not sample, so --top_k would do nothing" in capsys.readouterr().err


@pytest.mark.parametrize("flags, do_sample", [
    ([], None), (["--do_sample"], True), (["--temperature", "0.5"], True), (["--top_k", "5"], True),
    (["--num_beams", "2"], False), (["--num_beams", "2", "--top_p", "0.9"], True)])
def test_a_sampling_setting_samples_even_where_the_generation_config_is_greedy(causal_dir, flags, do_sample):
    with mock.patch.object(inference, "generate", return_value=["x"]) as run:
        inference.main(["--model", str(causal_dir), "--prompt", "the cat", *flags])
    assert run.call_args.kwargs["do_sample"] is do_sample  # None: the model's generation_config decides


def test_prompt_with_a_lone_surrogate_is_named(causal_dir):
    model, tokenizer = load_model_folder(causal_dir, device="cpu")
    with pytest.raises(ValueError, match=r"row 1 of the prompts .* at character 3, a lone surrogate"):
        generate(model, tokenizer, ["the cat", "the\ud800 dog"])


def test_damaged_tokenizer_and_generation_files_are_named(broken, capsys):
    (broken / "generation_config.json").write_text("xx")
    with pytest.raises(ValueError, match=r"generation_config.json is damaged"):
        load_model_folder(broken)
    (broken / "generation_config.json").unlink()
    (broken / "tokenizer.json").write_text("garbage")
    assert minitx(["generate", "--model", str(broken), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tokenizer.json is damaged" in err[0]
    (broken / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"tokenizer.json is missing"):
        load_model_folder(broken)


def test_dry_run_refuses_an_empty_prompt_before_staging(causal_dir, tmp_path, capsys):
    assert minitx(["push", "--model_dir", str(causal_dir), "--dry_run", str(tmp_path / "s"), "--prompt", " "]) == 2
    assert "--prompt is empty" in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_check_device_refuses_a_device_that_is_not_there(causal_dir, capsys):
    for device in ("tpu", "meta", "cuda"):
        assert minitx(["check-device", "--model_dir", str(causal_dir), "--device", device]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:"), err


def test_check_device_takes_model_as_generate_does_and_refuses_a_length_generate_refuses(causal_dir, capsys):
    base = ["check-device", "--model", str(causal_dir), "--device", "cpu", "--dtypes", "float32"]
    assert minitx([*base, "--max_new_tokens", "3"]) == 0
    assert "all checks passed" in capsys.readouterr().out
    assert minitx([*base, "--max_new_tokens", "300"]) == 2  # 32 learned positions
    assert "max_new_tokens=300 does not fit: the model has 32 positions (learned)" in capsys.readouterr().err
    assert minitx([*base, "--max_new_tokens", "0"]) == 2
    assert "--max_new_tokens must be >= 1" in capsys.readouterr().err


def test_a_prompt_the_shell_could_not_decode_is_named_before_loading(tmp_path, capsys):
    # no model is read first: the folder does not even exist
    assert minitx(["generate", "--model", str(tmp_path / "none"), "--prompt", "fine", "a \udcff b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--prompt 'a \\udcff b' has '\\udcff' at character 2, a byte that is not UTF-8" in err[0]


def test_several_continuations_are_printed_with_a_rule_between(causal_dir, capsys):
    with mock.patch.object(inference, "generate", return_value=[" one\ntwo", " three"]):
        inference.main(["--model", str(causal_dir), "--prompt", "a", "b"])
    assert capsys.readouterr().out == f"a one\ntwo\n{inference.OUTPUT_RULE}\nb three\n"
    with mock.patch.object(inference, "generate", return_value=[" one"]):
        inference.main(["--model", str(causal_dir), "--prompt", "a"])
    assert capsys.readouterr().out == "a one\n"  # one prompt: no rule


def test_a_folder_without_a_tokenizer_says_what_to_do_and_an_experiments_model_how_to_feed_it_ids(broken, capsys):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (broken / name).unlink(missing_ok=True)
    assert minitx(["generate", "--model", str(broken), "--prompt", "5 9 7"]) == 2
    assert "save the tokenizer next to the model (`tokenizer.save_pretrained(folder)`)" in capsys.readouterr().err
    (broken / ".minitx-run.json").write_text(json.dumps({"command": "experiment", "run_id": "x"}))
    assert minitx(["generate", "--model", str(broken), "--prompt", "5 9 7"]) == 2
    err = capsys.readouterr().err
    assert "made by `minitx experiment`, whose models read token ids: `minitx explore`" in err
    assert "save the tokenizer" not in err


def test_a_batch_of_prompts_pads_on_the_left_whatever_the_tokenizer_was_saved_with(causal_dir):
    # a tokenizer trained on a seq2seq corpus pads on the right; a decoder-only model generates from the prompts'
    # ends, so a batch continues each prompt as it continues alone
    model, tokenizer = load_model_folder(causal_dir, device="cpu", dtype=torch.float32)
    tokenizer.padding_side = "right"
    prompts = ["a", "the cat sat on the"]
    batched = generate(model, tokenizer, prompts, do_sample=False, max_new_tokens=6)
    alone = [generate(model, tokenizer, [prompt], do_sample=False, max_new_tokens=6)[0] for prompt in prompts]
    assert batched == alone
