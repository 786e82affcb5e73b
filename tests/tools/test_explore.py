"""`minitx explore`: the page's data is the model's own (attention, top-k, logit lens, each checkpoint's),
the page is self-contained and small, and bad input ends in one line, exit 2 and no file."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import another_writer, tiny_causal, tiny_config, tiny_seq2seq
from safetensors.torch import load_file

from hf_minitx.cli import main as minitx
from hf_minitx.folders import HTML_TAG, LOCK_FILE, html_written_by_us, read_marker, write_marker
from hf_minitx.tools import explore

TEXT = "5 9 7 4 12 6 15 8 3 11"


def _checkpoint(run: Path, step: int, model, *, safetensors: bool = False) -> Path:
    """A checkpoint-STEP folder as training writes it: the model's tensors and a run state."""
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if safetensors:
        from safetensors.torch import save_model

        save_model(model, str(folder / "model.safetensors"))
    else:
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    (folder / "run_state.json").write_text(json.dumps({"step": step}))
    return folder


def poison_weight(path: Path, name: str) -> None:
    """Put one NaN into tensor ``name`` of a safetensors file."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(path))
    assert name in weights, sorted(weights)
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(path), metadata={"format": "pt"})


@pytest.fixture
def causal_run(tmp_path):
    """A saved tiny model (the final one, step 30) and a run folder with two earlier checkpoints and metrics."""
    run = tmp_path / "run"
    run.mkdir()
    torch.manual_seed(1)
    for step in (10, 20):
        earlier = tiny_causal()
        with torch.no_grad():
            for param in earlier.parameters():
                param.add_(torch.randn_like(param) * 0.3 * step / 10)
        _checkpoint(run, step, earlier, safetensors=step == 20)
    final = tiny_causal()
    final.save_pretrained(run)
    (run / "training_summary.json").write_text(json.dumps({"steps": 30}))
    _checkpoint(run, 30, final)  # the last checkpoint of a finished run: the final weights, shown once
    lines = [{"type": "train", "step": s, "loss": 4.0 - s / 10} for s in range(1, 31)]
    lines.append({"type": "eval", "step": 30, "eval_loss": 1.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def unpack(packed: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(packed["data"]), dtype=np.uint8).reshape(packed["shape"]) / 255


def checkpoint_model(path: Path):
    model = tiny_causal()
    state = (torch.load(path / "pytorch_model.bin") if (path / "pytorch_model.bin").is_file()
             else load_file(str(path / "model.safetensors")))
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model.eval()


@torch.no_grad()
def test_each_snapshot_holds_that_checkpoints_attention_top_k_and_lens(causal_run):
    data = explore.explore_data(causal_run, TEXT, run=str(causal_run), top_k=4)
    assert [s["label"] for s in data["snapshots"]] == ["step 10", "step 20", "final (step 30)"]
    ids = torch.tensor([[int(w) for w in TEXT.split()]])
    models = [checkpoint_model(causal_run / "checkpoint-10"), checkpoint_model(causal_run / "checkpoint-20"),
              tiny_causal()]
    for snapshot, model in zip(data["snapshots"], models, strict=True):
        model.set_attn_implementation("eager")
        out = model(ids, output_attentions=True, output_hidden_states=True)
        expected = torch.stack([a[0] for a in out.attentions]).numpy()  # (layers, heads, q, k)
        assert np.abs(unpack(snapshot["attention"]["self"]) - expected).max() <= 0.5 / 255 + 1e-6
        probs, top = torch.softmax(out.logits[0], -1).topk(4)
        assert [[i for i, _ in position] for position in snapshot["top"]] == top.tolist()
        assert np.allclose([[p for _, p in position] for position in snapshot["top"]], probs.numpy(), atol=5e-4)
        # the lens: embeddings + one row per layer; its last row reads the model's own output
        assert len(snapshot["lens"]) == model.config.num_hidden_layers + 1
        assert [position[0][0] for position in snapshot["lens"][-1]] == top[:, 0].tolist()
        middle = model.lm_head(model.model.decoder.norm(out.hidden_states[1]))[0].argmax(-1)
        assert [position[0][0] for position in snapshot["lens"][1]] == middle.tolist()
    first, last = data["snapshots"][0], data["snapshots"][-1]
    assert first["top"] != last["top"] and first["attention"] != last["attention"]
    assert data["loss"]["train"][0] == [1, 3.9] and data["loss"]["eval"] == [[30, 1.5]]
    assert data["vocab"]["12"] == "12" and data["tokens"] == ids[0].tolist()


def test_model_info_counts_parameters_and_draws_positions(causal_run):
    info = explore.explore_data(causal_run, TEXT)["model"]
    assert sum(info["parameters"].values()) == info["total_parameters"] == tiny_causal().num_parameters()
    positions = info["positions"]
    assert len(positions["values"]) == len(positions["labels"]) == explore.CURVE_DIMS
    table = tiny_causal().model.decoder.embed_positions.weight.detach()
    assert positions["values"][0][:5] == pytest.approx(table[:5, 0].tolist(), abs=6e-4)
    assert info["config"]["num_hidden_layers"] == 2


def test_seq2seq_has_encoder_decoder_and_cross_attention(tmp_path):
    tiny_seq2seq().save_pretrained(tmp_path / "s2s")
    data = explore.explore_data(tmp_path / "s2s", "5 6 7", target="8 9")
    attention = data["snapshots"][0]["attention"]
    assert set(attention) == {"encoder", "decoder", "cross"}
    assert attention["cross"]["shape"][2:] == [3, 4]  # decoder start + 2 targets, over 3 sources + eos
    assert attention["encoder"]["shape"][2:] == [4, 4]
    assert np.allclose(unpack(attention["cross"]).sum(-1), 1, atol=0.02)  # each query's weights sum to 1
    assert data["tokens"][0] == tiny_config().decoder_start_token_id and len(data["snapshots"][0]["top"]) == 3


def test_page_is_self_contained_and_carries_the_data(causal_run, tmp_path):
    out = explore.write_explorer(causal_run, TEXT, tmp_path / "page.html", run=str(causal_run))
    page = out.read_text()
    assert html_written_by_us(out)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page), "the page must load nothing"
    assert "@import" not in page and "fetch(" not in page
    payload = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(payload.replace("<\\/", "</"))["text"] == TEXT


@pytest.mark.parametrize("text", ["</script><b>", "<!--<script> a", "__DATA__ __TITLE__", "x & y > z"])
def test_a_text_that_would_reshape_the_page_stays_data(text):
    page = explore.render_page({"text": text, "model": {"name": "m"}, "vocab": {"3": text}})
    head, rest = page.split('<script type="application/json" id="explorer-data">')
    payload, program = rest.split("</script>", 1)
    assert not re.search("[<>&]", payload), "'<!--<script>' in a script block would swallow the program"
    assert json.loads(payload) == {"text": text, "model": {"name": "m"}, "vocab": {"3": text}}
    assert page.count("</script>") == 2 and "const D = JSON.parse" in program  # the data block's and the program's
    assert re.search(r"<title>(.*)</title>", head).group(1) == html.escape(f"m: {text}")


def test_too_long_text_through_a_tokenizer_is_one_line(tmp_path, capfd):
    from hf_minitx.data.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(["the fox and the dog"] * 20, vocab_size=300, model_max_length=64)
    tiny_causal(vocab_size=len(tokenizer)).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    capfd.readouterr()
    out = tmp_path / "page.html"
    assert minitx(["explore", "--model", str(tmp_path / "m"), "--text", "fox " * 70, "--out", str(out)]) == 2
    err = capfd.readouterr().err  # the tokenizer's own warning about the length would be a second line
    assert re.match(r"error: --text takes \d+ tokens but the model has 64 positions", err) and err.count("\n") == 1, err
    assert not out.exists()


def test_six_layers_64_tokens_and_twelve_checkpoints_stay_under_5_mb(tmp_path):
    config = dict(num_hidden_layers=6, num_attention_heads=8, hidden_size=64, intermediate_size=128, vocab_size=512)
    run = tmp_path / "big"
    run.mkdir()
    for step in range(1, 13):
        _checkpoint(run, step, tiny_causal(**config))
    tiny_causal(**config).save_pretrained(run)
    text = " ".join(str(3 + i % 500) for i in range(64))
    out = explore.write_explorer(run, text, tmp_path / "big.html", run=str(run))
    assert len(json.loads(re.search(r'id="explorer-data">(.*?)</script>', out.read_text(), re.S).group(1))
               ["snapshots"]) == 13
    assert out.stat().st_size < 5_000_000, out.stat().st_size


def test_a_resumed_runs_history_is_ordered_by_step(causal_run):
    import shutil

    shutil.copytree(causal_run / "checkpoint-20", causal_run / "checkpoint-40")  # resumed past the final (30)
    (causal_run / "checkpoint-40" / "run_state.json").write_text(json.dumps({"step": 40}))
    data = explore.explore_data(causal_run, TEXT, run=str(causal_run))
    assert [view["step"] for view in data["snapshots"]] == [10, 20, 30, 40]


@torch.no_grad()
def test_an_interrupted_run_is_explored_through_its_checkpoints(tmp_path):
    """No final folder (the run stopped): its latest checkpoint is the model shown, built from the run's recorded
    settings and tokenizer, with the earlier checkpoints before it."""
    from hf_minitx.data.tokenizer import train_bpe_tokenizer
    from hf_minitx.training.setup import build_model

    run = tmp_path / "interrupted"
    run.mkdir()
    tokenizer = train_bpe_tokenizer([TEXT, "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"] * 5, vocab_size=300, min_frequency=1)
    tokenizer.save_pretrained(run)
    settings = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
                "max_position_embeddings": 64, "is_encoder_decoder": False}
    models = []
    for step in (2, 4):
        torch.manual_seed(step)
        model = build_model(tiny_config(**settings), tokenizer).eval()
        _checkpoint(run, step, model, safetensors=step == 4)
        (run / f"checkpoint-{step}" / "run_state.json").write_text(
            json.dumps({"step": step, "model_settings": settings}))
        models.append(model)
    data = explore.explore_data(run, TEXT, run=str(run), top_k=3)
    assert [s["label"] for s in data["snapshots"]] == ["step 2", "step 4 (latest checkpoint)"]
    ids = torch.tensor([data["tokens"]])
    for snapshot, model in zip(data["snapshots"], models, strict=True):
        top = torch.softmax(model(ids).logits[0], -1).topk(3).indices
        assert [[i for i, _ in position] for position in snapshot["top"]] == top.tolist()
    from hf_minitx.folders import weights_digest

    assert data["model"]["weights"] == weights_digest(run / "checkpoint-4") != weights_digest(run)  # what is shown
    page = tmp_path / "page.html"
    assert minitx(["explore", "--model", str(run), "--text", TEXT, "--out", str(page)]) == 0 and page.is_file()


def test_max_checkpoints_spreads_from_first_to_last():
    assert explore.spread(list(range(10)), 4) == [0, 3, 6, 9]
    assert explore.spread([1, 2], 5) == [1, 2]


@pytest.mark.parametrize("case", ["not-a-model", "run-without-checkpoints", "text-too-long", "seq2seq-no-target",
                                  "target-for-decoder-only", "not-html", "another-models-run", "damaged-checkpoint",
                                  "out-under-a-file", "empty-text", "run-not-a-folder", "no-model-folder",
                                  "nan-weight", "nan-checkpoint", "another-runs-history", "not-utf8-text",
                                  "interrupted-run", "interrupted-run-without-weights",
                                  "unrecorded-copy-and-another-run",
                                  "copied-over-another-run", "a-checkpoint-as-the-model", "top-k-past-the-panel",
                                  "empty-target"])
def test_bad_input_is_one_line_exit_2_and_no_file(case, causal_run, tmp_path, capsys):
    out = tmp_path / "out" / "page.html"
    argv = ["explore", "--model", str(causal_run), "--text", TEXT, "--out", str(out)]
    if case == "not-a-model":
        (tmp_path / "empty").mkdir()
        argv[2], expected = str(tmp_path / "empty"), "is not a model folder"
    elif case == "a-checkpoint-as-the-model":  # said only "not a model folder (no config.json)"
        argv[2] = str(causal_run / "checkpoint-30")
        expected = f"is a training checkpoint (the state a run resumes from), not a model folder; pass its run's " \
                   f"folder {causal_run}"
    elif case == "empty-target":  # said "The text to inspect is empty" of a --text that was not
        tiny_seq2seq().save_pretrained(tmp_path / "s2s")
        argv[2], expected = str(tmp_path / "s2s"), "--target is empty; pass some words"
        argv += ["--target", " "]
    elif case == "top-k-past-the-panel":  # 100,000 wrote 12 MB for 253 positions of one model
        argv += ["--top_k", "51"]
        expected = "--top_k must be from 1 to 50"
    elif case == "run-without-checkpoints":
        (tmp_path / "no-checkpoints").mkdir()
        argv += ["--run", str(tmp_path / "no-checkpoints")]
        expected = "holds no checkpoint-STEP folder"
    elif case == "text-too-long":
        argv[4], expected = " ".join(["5"] * 65), "takes 65 tokens but the model has 64 positions"
    elif case == "seq2seq-no-target":
        tiny_seq2seq().save_pretrained(tmp_path / "s2s")
        argv[2], expected = str(tmp_path / "s2s"), "give the output text with --target"
    elif case == "another-models-run":
        _checkpoint(tmp_path / "other", 5, tiny_causal(hidden_size=48))
        argv += ["--run", str(tmp_path / "other")]
        expected = "does not match the model in --model"
    elif case == "damaged-checkpoint":
        (causal_run / "checkpoint-20" / "model.safetensors").write_bytes(b"\0" * 100)
        argv += ["--run", str(causal_run)]
        expected = "checkpoint-20/model.safetensors is corrupted"
    elif case == "out-under-a-file":
        (tmp_path / "notes.txt").write_text("mine")
        out = tmp_path / "notes.txt" / "sub" / "page.html"
        argv[6], expected = str(out), f"{tmp_path / 'notes.txt'} is a file, not a folder; choose another --out"
    elif case == "empty-text":
        argv[4], expected = "", "--text is empty; pass some words"
    elif case == "run-not-a-folder":
        argv += ["--run", str(tmp_path / "missing-run")]
        expected = "missing-run is not a folder"
    elif case == "no-model-folder":
        argv[2], expected = str(tmp_path / "missing-model"), "missing-model does not exist; pass the folder of a saved"
    elif case == "another-runs-history":  # same shapes, another run: its checkpoints would mix in silently
        other = tmp_path / "other"
        _checkpoint(other, 5, tiny_causal())
        write_marker(other, command="train", run_id="run-b")
        write_marker(causal_run, command="train", run_id="run-a")
        argv += ["--run", str(other)]
        expected = "is run run-b, but --model"
    elif case == "unrecorded-copy-and-another-run":  # a copied model folder has no run record: weights decide
        other = tmp_path / "other"
        _checkpoint(other, 5, tiny_causal())
        final = tiny_causal()
        with torch.no_grad():
            next(final.parameters()).add_(1.0)
        final.save_pretrained(other)  # its final model: other weights than --model's
        assert read_marker(causal_run) is None
        argv += ["--run", str(other)]
        expected = "has no run record, and its weights are not the final model of --run"
    elif case == "copied-over-another-run":  # `cp A/* B/`: A's files, B's hidden run record and checkpoints
        other = tmp_path / "other"
        checkpoint = _checkpoint(other, 5, tiny_causal())
        (checkpoint / "run_state.json").write_text(json.dumps({"step": 5, "run_id": "run-b"}))
        write_marker(other, command="train", run_id="run-b")
        for path in causal_run.iterdir():
            if path.is_file():
                shutil.copy(path, other / path.name)
        summary = json.loads((other / "training_summary.json").read_text()) if (
            other / "training_summary.json").is_file() else {}
        (other / "training_summary.json").write_text(json.dumps({**summary, "run_id": "run-a"}))
        argv[2] = str(other)
        argv += ["--run", str(other)]
        expected = f"was trained by run run-a (its training_summary.json), but {checkpoint} was saved by run run-b"
    elif case == "not-utf8-text":  # a byte the shell could not decode arrives as a lone surrogate
        argv[4], expected = "5 9 \udcff 7", "--text '5 9 \\udcff 7' has '\\udcff' at character 4, a byte that is not"
    elif case == "interrupted-run":
        interrupted = tmp_path / "interrupted"
        _checkpoint(interrupted, 4, tiny_causal())
        argv[2] = str(interrupted)
        expected = "and no tokenizer: the run reads its tokenizer from elsewhere (--tokenizer)"
    elif case == "interrupted-run-without-weights":
        interrupted = tmp_path / "interrupted"
        (_checkpoint(interrupted, 4, tiny_causal()) / "pytorch_model.bin").unlink()
        argv[2], expected = str(interrupted), "holds checkpoints but no final model, and none of them holds weights"
    elif case == "nan-weight":  # a run that diverged: its page would embed bare NaN (not JSON) and stay blank
        poison_weight(causal_run / "model.safetensors", "model.decoder.layers.1.mlp.fc2.weight")
        expected = "non-finite value(s) (NaN or inf) in model.decoder.layers.1.mlp.fc2.weight"
    elif case == "nan-checkpoint":
        poison_weight(causal_run / "checkpoint-20" / "model.safetensors", "model.decoder.layers.0.mlp.fc1.weight")
        argv += ["--run", str(causal_run)]
        expected = ("checkpoint-20/model.safetensors holds 1 non-finite value(s) (NaN or inf) in "
                    "model.decoder.layers.0.mlp.fc1")
    elif case == "target-for-decoder-only":
        argv += ["--target", "5 6"]
        expected = "--target is for encoder-decoder models"
    else:
        out = tmp_path / "out" / "page.png"
        argv[6], expected = str(out), "--out must name an .html file"
    capsys.readouterr()  # what setting up printed
    assert minitx(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, err
    assert not out.parent.exists() and not (tmp_path / "out").exists()


def test_a_linked_page_is_rewritten_through_its_link_which_stays(causal_run, tmp_path, capsys):
    pages, link = tmp_path / "pages", tmp_path / "link.html"
    assert minitx(["explore", "--model", str(causal_run), "--text", TEXT, "--out", str(pages / "page.html")]) == 0
    link.symlink_to(pages / "page.html")
    assert minitx(["explore", "--model", str(causal_run), "--text", "5 6 7", "--out", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == (pages / "page.html").resolve()
    assert ": 5 6 7</title>" in (pages / "page.html").read_text() and sorted(p.name for p in pages.iterdir()) == [
        "page.html"]


def test_a_page_another_process_writes_is_refused_and_kept(causal_run, tmp_path, capsys):
    out = tmp_path / "page.html"
    out.write_text(f"<html><head>{HTML_TAG}</head>the first page</html>")
    lock = tmp_path / f".page.html{LOCK_FILE}"
    with another_writer(lock, pid=4242, host="box", command="explore"):
        assert minitx(["explore", "--model", str(causal_run), "--text", TEXT, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: --out {out} is being written by `minitx explore` (pid 4242 on box, "
                                       f"lock .page.html{LOCK_FILE}); wait for it to finish or stop it, or choose "
                                       "another --out\n")
    assert "the first page" in out.read_text()
    lock.unlink()
    assert minitx(["explore", "--model", str(causal_run), "--text", TEXT, "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html", "run"]


def test_a_file_minitx_did_not_write_is_kept(causal_run, tmp_path, capsys):
    out = tmp_path / "page.html"
    out.write_text("my notes")
    assert minitx(["explore", "--model", str(causal_run), "--text", TEXT, "--out", str(out)]) == 2
    assert out.read_text() == "my notes" and "--overwrite" in capsys.readouterr().err
    assert minitx(["explore", "--model", str(causal_run), "--text", TEXT, "--out", str(out), "--overwrite"]) == 0
    assert html_written_by_us(out)
    assert minitx(["explore", "--model", str(causal_run), "--text", "5 6", "--out", str(out)]) == 0  # ours: replaced


def test_rotary_models_draw_their_frequencies(tmp_path):
    from hf_minitx.models.positions_minitx import rope_inverse_frequencies

    tiny_causal(position_embedding_type="rope").save_pretrained(tmp_path / "rope")
    positions = explore.explore_data(tmp_path / "rope", "5 6 7")["model"]["positions"]
    inv_freq = rope_inverse_frequencies(tiny_config().head_dim, tiny_config().rope_theta)  # head_dim 8: 4 pairs
    assert positions["kind"] == "rope" and positions["labels"] == [f"pair {i}" for i in range(len(inv_freq))]
    assert positions["values"][1][:4] == pytest.approx(torch.cos(torch.arange(4.0) * inv_freq[1]).tolist(), abs=6e-4)
