"""The pictures of hf_minitx.tools.visualize: each PNG is written at the expected size, and the numbers drawn
are the right ones (attention rows sum to 1, causal maps are triangular, counts add up)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config
from PIL import Image

from hf_minitx import MiniTxForCausalLM, MiniTxForConditionalGeneration
from hf_minitx.tools import visualize as viz

REPO = Path(__file__).resolve().parents[2]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG that must exist and hold an image."""
    assert path.is_file() and path.stat().st_size > 1000, f"{path} missing or empty"
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def load_cli():
    """The module behind `minitx visualize` (its `main(argv)`)."""
    import hf_minitx.tools.visualize as module

    return module


@pytest.fixture
def causal_model():
    torch.manual_seed(0)
    return MiniTxForCausalLM(tiny_config(vocab_size=32, num_attention_heads=2)).eval()


@pytest.fixture
def seq2seq_model():
    torch.manual_seed(0)
    config = tiny_config(vocab_size=32, num_attention_heads=2, is_encoder_decoder=True)
    return MiniTxForConditionalGeneration(config).eval()


# --- attention -----------------------------------------------------------------------------------


def test_decoder_attention_rows_sum_to_one_and_are_causal(causal_model, tmp_path):
    out = tmp_path / "attn.png"
    data = viz.plot_attention(causal_model, text="5 6 7 8 9 10", out=out)
    weights = data["self"]
    assert weights.shape == (2, 2, 6, 6)  # (layers, heads, queries, keys)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, k=1) == 0), "a causal query attended to a future key"
    assert data["labels"]["self"][0] == ["5", "6", "7", "8", "9", "10"]
    # 2 layers x (2 heads + the average)
    assert png_size(out) == (round((2.3 * 3 + 1.0) * viz.DPI), round((2.5 * 2 + 0.6) * viz.DPI))


def test_attention_matches_the_models_own_output(causal_model, tmp_path):
    ids = [4, 9, 12, 3]
    data = viz.plot_attention(causal_model, text=" ".join(map(str, ids)), out=tmp_path / "a.png")
    expected = causal_model(torch.tensor([ids]), output_attentions=True).attentions
    np.testing.assert_allclose(data["self"][1], expected[1][0].detach().numpy(), atol=1e-6)


def test_seq2seq_maps_have_source_and_target_shapes(seq2seq_model, tmp_path):
    out = tmp_path / "s2s.png"
    data = viz.plot_attention(seq2seq_model, source="4 5 6 7 8 9", target="10 11 12", out=out)
    # EOS is appended to both sides: 7 source positions, 4 target positions
    assert data["encoder"].shape == (2, 2, 7, 7)
    assert data["decoder"].shape == (2, 2, 4, 4)
    assert data["cross"].shape == (2, 2, 4, 7)  # (layers, heads, target, source)
    for kind in ("encoder", "decoder", "cross"):
        np.testing.assert_allclose(data[kind].sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(data["decoder"], k=1) == 0)
    assert np.any(np.triu(data["encoder"], k=1) > 0), "the encoder sees the whole source"
    rows, cols = data["labels"]["cross"]
    assert rows == ["10", "11", "12", "<eos>"] and cols[-1] == "<eos>" and len(cols) == 7
    assert data["labels"]["decoder"][1][0] == "<bos>"  # decoder input starts with the start token
    assert png_size(out) == (round((2.3 * 3 + 1.0) * viz.DPI), round((2.5 * 6 + 0.6) * viz.DPI))


def test_cross_attention_only(seq2seq_model, tmp_path):
    out = tmp_path / "cross.png"
    data = viz.plot_attention(seq2seq_model, source="4 5", target="6", out=out, kinds=["cross"])
    assert data["cross"].shape == (2, 2, 2, 3)
    assert png_size(out)[1] == round((2.5 * 2 + 0.6) * viz.DPI)


def test_attention_from_a_saved_folder_with_tokenizer(tmp_path):
    from hf_minitx.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(REPO / "tokenizer")
    torch.manual_seed(0)
    model = MiniTxForCausalLM(tiny_config(vocab_size=len(tokenizer), num_attention_heads=2))
    model.save_pretrained(tmp_path / "model")  # saved with the default sdpa attention
    tokenizer.save_pretrained(tmp_path / "model")
    text = "In the beginning God created"
    data = viz.plot_attention(str(tmp_path / "model"), text=text, out=tmp_path / "kjv.png")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert data["self"].shape[-2:] == (len(ids), len(ids))
    np.testing.assert_allclose(data["self"].sum(-1), 1.0, atol=1e-5)
    assert "".join(data["labels"]["self"][0]).replace("\u00b7", " ") == text  # spaces marked as the page marks them


def test_attention_bad_input_is_explained(causal_model, seq2seq_model, tmp_path):
    with pytest.raises(ValueError, match=r"reads a source and a target \(--source and --target.*--source and "
                                         r"--target are missing; a single text \(--text\) is for decoder-only"):
        viz.plot_attention(seq2seq_model, text="4 5", out=tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"a source and a target .*: --target is missing$"):
        viz.plot_attention(seq2seq_model, source="4 5", out=tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"decoder-only model reads one text \(--text, or text=...\): it is missing; "
                                         "a source and a target"):
        viz.plot_attention(causal_model, source="4", target="5", out=tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"decoder-only model reads one text \(--text, or text=...\): it is missing$"):
        viz.plot_attention(causal_model, out=tmp_path / "x.png")
    with pytest.raises(ValueError, match="whitespace-separated token ids"):
        viz.plot_attention(causal_model, text="hello world", out=tmp_path / "x.png")
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        viz.plot_attention(causal_model, text="4 99", out=tmp_path / "x.png")
    with pytest.raises(ValueError, match="Unknown attention kind"):
        viz.plot_attention(causal_model, text="4 5", out=tmp_path / "x.png", kinds=["cross"])
    with pytest.raises(ValueError, match=".png"):
        viz.plot_attention(causal_model, text="4 5", out=tmp_path / "x.jpg")
    assert not list(tmp_path.iterdir()), "nothing is written when the input is rejected"
    with pytest.raises(FileNotFoundError, match="missing does not exist; pass the folder of a saved model"):
        viz.plot_attention(str(tmp_path / "missing"), text="4", out=tmp_path / "x.png")


# --- positions, masks ----------------------------------------------------------------------------


def test_positions_table_similarity_and_rotary(tmp_path):
    out = tmp_path / "pos.png"
    data = viz.plot_positions(16, 40, out, head_dim=8, rope_theta=100.0, curves=(0, 1, 6))
    table = data["table"]
    assert table.shape == (40, 16)
    pos = np.arange(40)
    np.testing.assert_allclose(table[:, 0], np.sin(pos), atol=1e-5)
    np.testing.assert_allclose(table[:, 3], np.cos(pos / 10000.0 ** (2 / 16)), atol=1e-5)
    sim = data["similarity"]
    np.testing.assert_allclose(sim[:-5, :-5], sim[5:, 5:], atol=1e-4)  # depends on the distance only
    np.testing.assert_allclose(np.diag(sim), 8.0, atol=1e-4)  # sin² + cos² over dim / 2 pairs
    np.testing.assert_allclose(data["rope_inv_freq"], [1.0, 100 ** -0.25, 100 ** -0.5, 100 ** -0.75], rtol=1e-5)
    np.testing.assert_allclose(data["rope_wavelength"] * data["rope_inv_freq"], 2 * math.pi, rtol=1e-6)
    assert png_size(out) == (1200, 850)


@pytest.mark.parametrize("kwargs, match", [
    ({"dim": 15}, "even"), ({"length": 1}, "length"), ({"dim": 8, "curves": (9,)}, "outside"),
    ({"length": 100_000}, "length must be 2 to 4096 positions"), ({"dim": 100_000}, "dim at most 4096"),
    ({"rope_theta": 0.0}, "rope_theta must be greater than 1"), ({"rope_theta": -1.0}, "rope_theta"),
    ({"rope_theta": float("inf")}, "rope_theta"), ({"head_dim": 200_000_000}, "head_dim at most 4096"),
])
def test_positions_bad_input(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        viz.plot_positions(out=tmp_path / "p.png", **kwargs)


def test_masks_are_triangular_and_hide_padding(tmp_path):
    out = tmp_path / "masks.png"
    data = viz.plot_masks(8, out, num_padding=2)
    causal, padding, combined = data["causal"], data["padding"], data["combined"]
    assert causal.shape == padding.shape == combined.shape == (8, 8)
    assert np.array_equal(causal, np.tril(np.ones((8, 8), dtype=bool)))
    assert not padding[:, :2].any() and padding[:, 2:].all()
    assert np.array_equal(combined, (causal & padding) | np.eye(8, dtype=bool))
    assert png_size(out) == (1300, 480)
    with pytest.raises(ValueError, match="num_padding"):
        viz.plot_masks(4, tmp_path / "m.png", num_padding=4)
    with pytest.raises(ValueError, match="length must be 2 to 512"):
        viz.plot_masks(100_000, tmp_path / "m.png")


# --- parameters ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seq2seq", [False, True])
@pytest.mark.parametrize("tied", [True, False])
def test_param_counts_add_up(seq2seq, tied, tmp_path):
    config = tiny_config(is_encoder_decoder=seq2seq, tie_word_embeddings=tied)
    model = MiniTxForConditionalGeneration(config) if seq2seq else MiniTxForCausalLM(config)
    counts = viz.plot_params(model, tmp_path / "params.png")
    assert sum(counts.values()) == model.num_parameters()
    assert "other" not in counts
    h, inner, v = config.hidden_size, config.intermediate_size, config.vocab_size
    attention_blocks = 2 + 2 * 2 if seq2seq else 2  # encoder self + decoder self and cross, per layer
    assert counts["attention"] == attention_blocks * 4 * (h * h + h)
    assert counts["feed-forward"] == (4 if seq2seq else 2) * (h * inner + inner + inner * h + h)
    assert counts["output head"] == (0 if tied else v * h)
    stacks = 2 if seq2seq else 1  # one learned position table per stack, one shared token table
    assert counts["embeddings"] == v * h + stacks * config.max_position_embeddings * h
    assert png_size(tmp_path / "params.png") == (1200, 480)
    table = viz.format_param_table(counts)
    assert f"{model.num_parameters():,}" in table.splitlines()[-1]


def test_parameter_component_names():
    assert viz.parameter_component("model.decoder.layers.0.cross_attn.k_proj.weight") == "attention"
    assert viz.parameter_component("model.decoder.layers.0.cross_attn_layer_norm.bias") == "layer norms"
    assert viz.parameter_component("model.encoder.embed_positions.weight") == "embeddings"
    assert viz.parameter_component("model.decoder.layers.1.mlp.fc2.bias") == "feed-forward"
    assert viz.parameter_component("lm_head.weight") == "output head"


# --- training curves -----------------------------------------------------------------------------


def write_metrics(folder: Path, losses: list[float]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for step, loss in enumerate(losses, start=1):
        lines.append({"type": "train", "step": step, "epoch": step / 10, "loss": loss, "learning_rate": 1e-3 * step,
                      "tokens_per_second": 100.0 * step, "tokens_seen": 64 * step, "elapsed_seconds": 0.1 * step})
        if step % 2 == 0:
            lines.append({"type": "eval", "step": step, "eval_loss": loss + 0.5, "eval_exact_match": step / 10})
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return folder


def test_training_curves_read_every_record(tmp_path):
    run = write_metrics(tmp_path / "run", [3.0, 2.5, 2.0, 1.5])
    out = tmp_path / "curves.png"
    data = viz.plot_training(run, out)["run"]
    np.testing.assert_array_equal(data["train_step"], [1, 2, 3, 4])
    np.testing.assert_array_equal(data["train_loss"], [3.0, 2.5, 2.0, 1.5])
    np.testing.assert_allclose(data["learning_rate"], [1e-3, 2e-3, 3e-3, 4e-3])
    np.testing.assert_array_equal(data["tokens_per_second"], [100, 200, 300, 400])
    np.testing.assert_array_equal(data["eval_step"], [2, 4])
    np.testing.assert_array_equal(data["eval_loss"], [3.0, 2.0])
    np.testing.assert_array_equal(data["eval_exact_match"], [0.2, 0.4])
    assert png_size(out) == (1200, 800)


def test_a_run_of_one_logged_step_is_drawn_as_points(tmp_path, monkeypatch):
    """A line through one point draws nothing: a run that logged one step gets markers, a longer one keeps lines."""
    import hf_minitx.training.curves as curves

    drawn = {}
    monkeypatch.setattr(curves, "save_figure", lambda fig, out: drawn.setdefault("fig", fig))
    runs = {"one": write_metrics(tmp_path / "one", [3.0]), "two": write_metrics(tmp_path / "two", [3.0, 2.0])}
    viz.plot_training(runs, tmp_path / "c.png")
    loss_ax, lr_ax, speed_ax, _ = drawn["fig"].axes
    for ax in (loss_ax, lr_ax, speed_ax):
        markers = {line.get_label().split(" ")[0]: line.get_marker() for line in ax.lines
                   if not line.get_label().endswith("validation")}
        assert markers == {"one": "o", "two": "None"}, (ax.get_title(), markers)


def test_training_curves_side_by_side(tmp_path):
    runs = {"post": write_metrics(tmp_path / "a", [3.0, 2.0]), "pre": write_metrics(tmp_path / "b", [3.0, 1.0])}
    data = viz.plot_training(runs, tmp_path / "both.png")
    assert list(data) == ["post", "pre"]
    assert data["pre"]["train_loss"][-1] == 1.0
    png_size(tmp_path / "both.png")


def test_training_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="No metrics file at .*metrics.jsonl"):
        viz.plot_training(tmp_path, tmp_path / "c.png")
    with pytest.raises(FileNotFoundError, match="nonexistent does not exist; pass a training output folder"):
        viz.plot_training(tmp_path / "nonexistent", tmp_path / "c.png")
    (tmp_path / "metrics.jsonl").write_text('{"type": "train", "step": 1, "loss": 1.0}\nnot json\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        viz.plot_training(tmp_path, tmp_path / "c.png")
    (tmp_path / "metrics.jsonl").write_text('{"type": "eval", "step": 1, "eval_loss": 1.0}\n')
    with pytest.raises(ValueError, match="no train records"):
        viz.plot_training(tmp_path, tmp_path / "c.png")


# --- command line --------------------------------------------------------------------------------


def test_cli_writes_each_picture(seq2seq_model, tmp_path, capsys):
    cli = load_cli()
    seq2seq_model.save_pretrained(tmp_path / "model")
    write_metrics(tmp_path / "run", [2.0, 1.0])
    commands = {
        "masks": ["masks", "--length", "5"],
        "positions": ["positions", "--dim", "16", "--length", "20"],
        "training": ["training", "--run", str(tmp_path / "run")],
        "params": ["params", "--model", str(tmp_path / "model")],
        "attention": ["attention", "--model", str(tmp_path / "model"), "--source", "4 5 6", "--target", "4 5 6",
                      "--kinds", "cross"],
    }
    for name, argv in commands.items():
        out = tmp_path / f"{name}.png"
        assert cli.main([*argv, "--out", str(out)]) == out
        png_size(out)
    assert f"{seq2seq_model.num_parameters():,}" in capsys.readouterr().out
    with pytest.raises(ValueError, match="must name a .png file"):
        cli.main(["masks", "--out", str(tmp_path / "masks.svg")])


def test_a_token_holding_part_of_a_character_is_labelled_with_its_bytes_not_a_replacement_mark():
    from hf_minitx.data.tokenizer import train_bpe_tokenizer
    from hf_minitx.tools.explore import vocabulary
    from hf_minitx.tools.model_reading import token_labels, token_text

    tokenizer = train_bpe_tokenizer(["the cat sat on the mat\n"] * 50, vocab_size=300)
    ids = tokenizer("hé 😀 �", add_special_tokens=False)["input_ids"]  # é, the emoji and U+FFFD: no merges
    texts = [token_text(i, tokenizer) for i in ids]
    assert "\ufffd" not in "".join(texts) and texts[-3:] == ["<0xEF>", "<0xBF>", "<0xBD>"]  # U+FFFD's own bytes
    assert texts[:3] == ["h", "<0xC3>", "<0xA9>"] and ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"] == texts[4:8]
    assert token_labels(ids[:3], tokenizer, tiny_config()) == texts[:3]
    assert vocabulary(set(ids), tokenizer, tiny_config())[str(ids[1])] == "<0xC3>"  # the page's, escaped by no one


def test_control_characters_are_labelled_as_escapes_not_missing_glyphs():
    """No font draws ESC or a tab: matplotlib warned and drew an empty box."""
    from hf_minitx.data.tokenizer import train_bpe_tokenizer
    from hf_minitx.tools.model_reading import token_labels

    tokenizer = train_bpe_tokenizer(["the cat sat on the mat\n"] * 50, vocab_size=300)
    ids = tokenizer("a\x1bb\tc\nd e_f", add_special_tokens=False)["input_ids"]
    assert "".join(token_labels(ids, tokenizer, tiny_config())) == "a\\x1bb\\tc\\nd\u00b7e_f"  # a space: a dot


def test_attention_of_a_text_longer_than_the_positions_is_refused_as_the_explorer_refuses_it():
    model = MiniTxForCausalLM(tiny_config(max_position_embeddings=8)).eval()
    with pytest.raises(ValueError, match="--text takes 9 tokens but the model has 8 positions; shorten it"):
        viz.attention_weights(model, text=" ".join(str(i) for i in range(9)))
    assert viz.attention_weights(model, text=" ".join(str(i) for i in range(8)))["self"].shape[-1] == 8
