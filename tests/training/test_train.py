"""The Accelerate training loop: falling loss on both tasks, exact resume, 2-process equivalence, the saved
folder, non-finite loss, and a clear error for each bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_same_weights, free_port, kill_then_resume
from safetensors.torch import load_file

from hf_minitx.cli import main as minitx
from hf_minitx.models import MiniTxConfig
from hf_minitx.training.arguments import TrainArguments, parse_training_args
from hf_minitx.training.checkpoints import write_run_state
from hf_minitx.training.divergence import NonFiniteLossError
from hf_minitx.training.loop import main
from hf_minitx.training.run_length import late_dropout_plan
from hf_minitx.training.run_plan import resolve_model_settings, run_identity

REPO = Path(__file__).resolve().parents[2]
WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing about rivers, hills and "
         "old stone bridges near the quiet town").split()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each in-process run builds its own Accelerator; forget the previous one's singletons."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    """~200 paragraphs of pseudo-English with structure a tiny model can learn quickly."""
    rng = torch.Generator().manual_seed(0)
    paragraphs = []
    for _ in range(200):
        start = int(torch.randint(0, len(WORDS), (1,), generator=rng))
        length = int(torch.randint(12, 30, (1,), generator=rng))
        paragraphs.append(" ".join(WORDS[(start + i) % len(WORDS)] for i in range(length)) + ".")
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(paragraphs) + "\n")
    return path


def causal_args(text_file: Path, output_dir: Path, *extra: str) -> list[str]:
    """A tiny causal-LM run on the local corpus, fast enough for a unit test."""
    return [
        "--task", "causal-lm", "--dataset", str(text_file), "--preset", "tiny",
        "--config_overrides", "hidden_size=32,intermediate_size=64,max_position_embeddings=64",
        "--tokenizer_vocab_size", "300", "--block_size", "32", "--output_dir", str(output_dir),
        "--per_device_train_batch_size", "8", "--learning_rate", "3e-3", "--warmup_steps", "2",
        "--logging_steps", "1", "--eval_steps", "0", "--max_eval_samples", "16", "--num_sample_generations", "1",
        "--disable_tqdm", "--num_threads", "1", *extra,
    ]


def seq2seq_args(output_dir: Path, *extra: str) -> list[str]:
    return [
        "--task", "seq2seq", "--dataset", "builtin:numbers-en-fr", "--num_examples", "600", "--preset", "tiny",
        "--tokenizer_vocab_size", "300", "--max_source_length", "32", "--max_target_length", "32",
        "--output_dir", str(output_dir), "--per_device_train_batch_size", "16", "--learning_rate", "3e-3",
        "--warmup_steps", "5", "--logging_steps", "1", "--eval_steps", "0", "--generation_eval_samples", "16",
        "--max_eval_samples", "32", "--num_sample_generations", "1", "--disable_tqdm", "--num_threads", "1", *extra,
    ]


def resume_from_copy(straight: Path, resumed: Path, checkpoint: str = "checkpoint-2", kept_lines: int = 2) -> None:
    """Make `resumed` the folder of `straight`'s run killed after `checkpoint`: that checkpoint and the first
    `kept_lines` lines of its metrics; and forget the last in-process run's Accelerate singletons."""
    from accelerate.state import AcceleratorState, GradientState

    resumed.mkdir()
    shutil.copytree(straight / checkpoint, resumed / checkpoint)
    lines = (straight / "metrics.jsonl").read_text().splitlines()
    (resumed / "metrics.jsonl").write_text("\n".join(lines[:kept_lines]) + "\n")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def records(output_dir: Path, kind: str) -> list[dict]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


@pytest.fixture(scope="module")
def causal_run(text_file, tmp_path_factory) -> Path:
    """One finished 30-step causal run shared by the tests that only read its outputs."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    out = tmp_path_factory.mktemp("runs") / "causal"
    main(causal_args(text_file, out, "--max_steps", "30", "--learning_rate", "1e-2", "--sample_prompts", "the quick"))
    return out


# --- training on both tasks -------------------------------------------------------------------------


@pytest.mark.slow
def test_causal_lm_loss_falls_and_records_metrics(causal_run):
    train = records(causal_run, "train")
    assert [r["step"] for r in train] == list(range(1, 31))
    first, last = sum(r["loss"] for r in train[:3]) / 3, sum(r["loss"] for r in train[-3:]) / 3
    assert last < 0.7 * first, (first, last)
    assert {"epoch", "learning_rate", "tokens_per_second", "tokens_seen", "elapsed_seconds"} <= set(train[-1])
    assert train[-1]["tokens_seen"] == 30 * 8 * 32  # every token of every block was read
    final, calibrated = records(causal_run, "eval")  # the last step's, then the model with its fitted temperature
    assert final["step"] == calibrated["step"] == 30
    summary = json.loads((causal_run / "training_summary.json").read_text())
    fitted = summary["calibration"]
    assert calibrated["temperature"] == fitted["temperature"] == round(1 / fitted["logit_scale"], 4)
    assert fitted["fitted_loss_before"] == pytest.approx(final["eval_loss"], rel=1e-6)  # the whole (small) split
    assert calibrated["eval_loss"] == pytest.approx(fitted["fitted_loss_after"], rel=1e-5)
    assert calibrated["eval_loss"] < final["eval_loss"]
    assert summary["final_metrics"] == {k: v for k, v in calibrated.items() if k.startswith("eval_")}
    assert final["eval_perplexity"] == pytest.approx(torch.tensor(final["eval_loss"]).exp().item(), rel=1e-6)
    # bits per byte: nats -> bits, per UTF-8 byte; a ~300-token BPE covers ~3-4 bytes per token
    bits_per_token = final["eval_loss"] / torch.log(torch.tensor(2.0)).item()
    assert 1.5 < bits_per_token / final["eval_bits_per_byte"] < 8
    assert "warning" not in json.loads((causal_run / "training_summary.json").read_text())  # it learned


def test_a_run_that_ends_at_chance_says_so_in_its_summary_and_last_line(text_file, tmp_path, capsys):
    out = tmp_path / "dead"
    main(causal_args(text_file, out, "--max_steps", "1", "--learning_rate", "1e-6"))  # nothing learned
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads((out / "training_summary.json").read_text())
    assert last == summary["warning"] and last.startswith("warning: the final evaluation is at chance")
    assert summary["final_metrics"]["eval_perplexity"] > 150 and "-token vocabulary" in last


@pytest.mark.slow
def test_seq2seq_loss_falls_and_reports_generation_metrics(tmp_path):
    out = tmp_path / "s2s"
    main(seq2seq_args(out, "--max_steps", "40"))
    train = records(out, "train")
    assert train[-1]["loss"] < 0.7 * train[0]["loss"]
    (final,) = records(out, "eval")
    assert 0.0 <= final["eval_exact_match"] <= 100.0 and 0.0 <= final["eval_bleu"] <= 100.0
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["task"] == "seq2seq" and summary["steps"] == 40
    assert "late_dropout" not in summary["recipe"]  # off by default for seq2seq (not measured there)
    assert summary["final_metrics"]["eval_exact_match"] == final["eval_exact_match"]

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.generation_config.decoder_start_token_id == tokenizer.bos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.max_new_tokens == 32
    # the folder's tokenizer pads on the right, as BART's: transformers' own collator then batches what ours does
    from transformers import DataCollatorForSeq2Seq

    from hf_minitx.data.preprocessing import seq2seq_collator

    assert tokenizer.padding_side == "right"
    rows = [{"input_ids": tokenizer("seven hundred and twelve")["input_ids"],
             "labels": tokenizer("sept", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]},
            {"input_ids": tokenizer("one")["input_ids"],
             "labels": tokenizer("sept cent douze", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]}]
    ours, stock = seq2seq_collator(tokenizer)(rows), DataCollatorForSeq2Seq(tokenizer, model=model)(rows)
    for name in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(ours[name], stock[name]), name


# --- the saved folder --------------------------------------------------------------------------------


@pytest.mark.slow
def test_saved_folder_loads_with_auto_classes_and_generates(causal_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "modeling_minitx.py", "training_summary.json", "loss_curve.png", "README.md"):
        assert (causal_run / name).is_file(), name
    modes = {(path.stat().st_mode & 0o777) for path in causal_run.iterdir() if path.is_file()}
    assert len(modes) == 1, modes  # the weights as readable as the rest (safetensors alone writes them 0600)
    config = json.loads((causal_run / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"].endswith("MiniTxForCausalLM")
    model = AutoModelForCausalLM.from_pretrained(causal_run)
    tokenizer = AutoTokenizer.from_pretrained(causal_run)
    assert config["vocab_size"] == len(tokenizer)
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (
        tokenizer.eos_token_id, tokenizer.pad_token_id)
    saved = load_file(causal_run / "model.safetensors")
    for name, tensor in model.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name
    ids = tokenizer("the quick", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, ids["input_ids"].shape[1] + 5) or tokenizer.eos_token_id in out[0].tolist()
    summary = json.loads((causal_run / "training_summary.json").read_text())
    expected = {"task", "dataset", "dataset_config", "hub_dataset", "steps", "tokens_seen", "train_seconds",
                "hardware", "mixed_precision", "num_processes", "final_metrics", "sample_generations", "preset",
                "seed"}
    assert expected <= set(summary)
    assert summary["sample_generations"][0]["prompt"] == "the quick"
    assert summary["hub_dataset"] is False and summary["mixed_precision"] == "no"


@pytest.mark.slow
def test_summary_records_the_recipe(causal_run):
    summary = json.loads((causal_run / "training_summary.json").read_text())
    recipe = summary["recipe"]
    defaults = parse_training_args([])[2]
    assert recipe["optimizer"] == defaults.optimizer
    assert recipe["schedule"]["type"] == defaults.lr_scheduler_type and recipe["schedule"]["total_steps"] == 30
    assert (recipe["block_size"], recipe["per_device_train_batch_size"], recipe["global_batch_size"]) == (32, 8, 8)
    assert recipe["max_grad_norm"] == 1.0
    groups = recipe["parameter_groups"]
    assert sum(g["parameters"] for g in groups) == summary["num_parameters"]  # every parameter, once
    assert all({"name", "optimizer", "learning_rate", "weight_decay", "tensors"} <= set(g) for g in groups)
    assert summary["tokens_seen"] == 30 * 8 * 32
    assert recipe["late_dropout"]["probability"] == 0.1  # causal-lm's default
    # the run id travels with the summary (explore matches it to the checkpoints of a --run)
    assert summary["run_id"] == json.loads((causal_run / ".minitx-run.json").read_text())["run_id"]


# --- exact resume --------------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_gives_the_same_weights_as_a_straight_run(text_file, tmp_path):
    """6 straight steps == 3 steps, stop, resume from checkpoint-3, 3 more (dropout on, accumulation 2)."""
    extra = ("--max_steps", "6", "--gradient_accumulation_steps", "2", "--checkpointing_steps", "3",
             "--config_overrides", "hidden_size=32,intermediate_size=64,max_position_embeddings=64,hidden_dropout=0.1")
    straight = tmp_path / "straight"
    main(causal_args(text_file, straight, *extra))

    # An interrupted run: its folder holds only what existed after step 3 (tokenizer, metrics, checkpoint).
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    import shutil

    shutil.copytree(straight / "checkpoint-3", resumed / "checkpoint-3")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(straight / name, resumed / name)
    lines = (straight / "metrics.jsonl").read_text().splitlines()
    (resumed / "metrics.jsonl").write_text("\n".join(lines[:3] + lines[5:]) + "\n")  # plus records to drop

    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    main(causal_args(text_file, resumed, *extra, "--resume_from_checkpoint", "latest"))

    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [r["loss"] for r in records(straight, "train")] == [r["loss"] for r in records(resumed, "train")]


def test_a_resume_inside_a_logging_window_writes_the_records_of_a_straight_run(text_file, tmp_path):
    """A checkpoint at step 3 of a window logged at step 4: the resumed run's record averages steps 1 to 4 too."""
    import shutil

    from accelerate.state import AcceleratorState, GradientState

    extra = ("--max_steps", "8", "--logging_steps", "4", "--checkpointing_steps", "3")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    main(causal_args(text_file, straight, *extra))
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-3", resumed / "checkpoint-3")
    for name in ("tokenizer.json", "tokenizer_config.json", "metrics.jsonl"):
        shutil.copy(straight / name, resumed / name)  # the resume drops the records past its checkpoint
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    main(causal_args(text_file, resumed, *extra, "--resume_from_checkpoint", "latest"))
    same = ("step", "loss", "learning_rate", "tokens_seen")
    expected = [{key: r[key] for key in same} for r in records(straight, "train")]
    assert [r["step"] for r in expected] == [4, 8]
    assert [{key: r[key] for key in same} for r in records(resumed, "train")] == expected


@pytest.mark.slow
def test_muon_and_wsd_kill_9_then_resume_gives_the_weights_of_an_uninterrupted_run(text_file, tmp_path):
    """Muon + AdamW (both states in the checkpoint) and the WSD schedule: SIGKILL after checkpoint-3, resume."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    extra = ("--max_steps", "6", "--checkpointing_steps", "3", "--optimizer", "muon", "--lr_scheduler_type",
             "warmup_stable_decay", "--decay_ratio", "0.5", "--config_overrides",
             "hidden_size=32,intermediate_size=64,max_position_embeddings=64,hidden_dropout=0.1,tie_word_embeddings=false")
    straight, killed = tmp_path / "straight", tmp_path / "killed"

    def both_states_saved(folder: Path) -> None:
        saved = torch.load(folder / "checkpoint-3" / "optimizer.bin", weights_only=False)
        assert set(saved) == {"muon", "adamw"} and saved["muon"]["state"] and saved["adamw"]["state"]

    kill_then_resume(lambda folder: causal_args(text_file, folder, *extra), straight, killed, env, REPO,
                     both_states_saved)
    assert_same_weights(straight, killed)
    assert [r["loss"] for r in records(straight, "train")] == [r["loss"] for r in records(killed, "train")]
    assert [r["learning_rate"] for r in records(straight, "train")] == [
        r["learning_rate"] for r in records(killed, "train")]
    train = records(straight, "train")
    assert train[-1]["loss"] < train[0]["loss"]  # it learns
    assert train[2]["learning_rate"] > 0  # the schedule reaches Muon


@pytest.mark.slow
@pytest.mark.parametrize("passes, after_the_kill", [("0.04", False), ("0.12", True)])
def test_late_dropout_starts_at_its_planned_pass_and_a_killed_run_resumes_through_it(text_file, tmp_path, passes,
                                                                                      after_the_kill):
    """--late_dropout: the steps before its pass train exactly as a run without it, the ones after differently;
    killed at checkpoint-3, before or after the switch, the resumed run drops as planned and ends bit-identical."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    extra = ("--max_steps", "7", "--checkpointing_steps", "3", "--late_dropout", "0.3", "--late_dropout_passes", passes)
    straight, killed, plain = tmp_path / "straight", tmp_path / "killed", tmp_path / "plain"
    kill_then_resume(lambda folder: causal_args(text_file, folder, *extra), straight, killed, env, REPO)
    assert_same_weights(straight, killed)
    late = json.loads((straight / "training_summary.json").read_text())["recipe"]["late_dropout"]
    assert late["probability"] == 0.3 and 1 <= late["from_step"] < 7 and (late["from_step"] > 3) == after_the_kill
    main(causal_args(text_file, plain, *extra[:4], "--late_dropout", "0"))
    with_late, without = ([r["loss"] for r in records(folder, "train")] for folder in (straight, plain))
    first = late["from_step"]  # records are numbered from 1; the step numbered from_step + 1 is the first with it
    assert with_late[:first] == without[:first]
    assert all(a != b for a, b in zip(with_late[first:], without[first:], strict=True))
    assert "late_dropout" not in json.loads((plain / "training_summary.json").read_text())["recipe"]


def test_how_often_a_run_evaluates_changes_no_dropout_mask(text_file, tmp_path):
    """An evaluation draws from the random stream (a pass over a DataLoader takes a seed) that the training
    steps draw their dropout masks from: it is restored after each, so --eval_steps changes no weight."""
    extra = ("--max_steps", "8", "--late_dropout", "0.3", "--late_dropout_passes", "0.01")
    main(causal_args(text_file, tmp_path / "never", *extra))
    main(causal_args(text_file, tmp_path / "often", *extra, "--eval_steps", "2"))
    assert len(records(tmp_path / "often", "eval")) >= len(records(tmp_path / "never", "eval")) + 3
    assert_same_weights(tmp_path / "never", tmp_path / "often")


def test_late_dropout_is_planned_in_passes_and_stays_off_where_it_does_not_apply():
    args = TrainArguments(late_dropout=0.1, late_dropout_passes=2.0)
    assert late_dropout_plan(args, MiniTxConfig(), batches_per_epoch=659, accumulation_steps=1) == (1318, 0.1)
    assert late_dropout_plan(args, MiniTxConfig(), batches_per_epoch=659, accumulation_steps=4) == (330, 0.1)
    assert late_dropout_plan(args, MiniTxConfig(), batches_per_epoch=None, accumulation_steps=1) is None  # a stream
    assert late_dropout_plan(args, MiniTxConfig(hidden_dropout=0.2), 659, 1) is None  # the model's own dropout
    assert late_dropout_plan(TrainArguments(late_dropout=0.0), MiniTxConfig(), 659, 1) is None


# --- two processes -------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_match_one_process_at_the_same_global_batch(text_file, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    common = ("--max_steps", "5", "--eval_steps", "5", "--gradient_accumulation_steps", "2", "--optimizer", "muon")
    one = tmp_path / "one"
    two = tmp_path / "two"
    subprocess.run([sys.executable, "-m", "hf_minitx", "train",
                    *causal_args(text_file, one, *common)], check=True, env=env, cwd=REPO, timeout=240)
    args = causal_args(text_file, two, *common)
    args[args.index("--per_device_train_batch_size") + 1] = "4"
    # On a machine without GPU, --multi_gpu makes accelerate start N processes (torchrun); the training
    # script then joins them as a multi-CPU gloo group. (--cpu would start one process only.)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port())]
    # `-m hf_minitx train`: the form that works with the installed package, no script path needed
    subprocess.run([*launch, "-m", "hf_minitx", "train", *args], check=True, env=env, cwd=REPO, timeout=240)

    loss_one = [r["loss"] for r in records(one, "train")]
    loss_two = [r["loss"] for r in records(two, "train")]
    assert len(loss_two) == 5  # logged once, not once per process
    assert loss_two == pytest.approx(loss_one, rel=1e-5)
    eval_one, eval_two = records(one, "eval"), records(two, "eval")
    assert len(eval_two) == len(eval_one) == 2  # the last step's, then the calibrated model's
    assert [r["eval_loss"] for r in eval_two] == pytest.approx([r["eval_loss"] for r in eval_one], rel=1e-5)
    summary_one, summary_two = (json.loads((d / "training_summary.json").read_text()) for d in (one, two))
    assert summary_two["num_processes"] == 2  # the temperature is fitted on the same tokens, split over processes:
    assert summary_two["calibration"]["fitted_on_tokens"] == summary_one["calibration"]["fitted_on_tokens"]
    assert summary_two["calibration"]["logit_scale"] == pytest.approx(summary_one["calibration"]["logit_scale"],
                                                                      rel=1e-4)
    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


# --- non-finite loss -----------------------------------------------------------------------------


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(text_file, tmp_path, monkeypatch):
    import hf_minitx.training.loss as loss_module

    real = loss_module.sequence_cross_entropy  # the trainer's loss (evaluation imports its own reference)
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        nats, counts = real(*args, **kwargs)
        return (nats * float("nan"), counts) if calls["n"] == 5 else (nats, counts)

    monkeypatch.setattr(loss_module, "sequence_cross_entropy", poisoned)
    out = tmp_path / "nan"
    with pytest.raises(NonFiniteLossError, match="step 5.*checkpoint-4.*start again with --overwrite_output_dir"):
        main(causal_args(text_file, out, "--max_steps", "8", "--checkpointing_steps", "2",
                         "--save_total_limit", "5"))
    assert (out / "checkpoint-4").is_dir() and not (out / "checkpoint-6").exists()
    assert not (out / "model.safetensors").exists()


# --- arguments and bad input (no training) --------------------------------------------------------


def test_args_file_gives_defaults_and_the_command_line_overrides(tmp_path):
    args_file = tmp_path / "run.json"
    args_file.write_text(json.dumps({"task": "seq2seq", "learning_rate": 0.005, "preset": "small"}))
    model_args, data_args, train_args = parse_training_args([str(args_file), "--learning_rate", "0.001"])
    assert (data_args.task, model_args.preset, train_args.learning_rate) == ("seq2seq", "small", 0.001)
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("block_size: 64\nmax_steps: 7\n")
    _, data_args, train_args = parse_training_args([str(yaml_file)])
    assert (data_args.block_size, train_args.max_steps) == (64, 7)


def test_args_file_after_an_option_is_told_to_go_first(tmp_path):
    """Given after the options it was taken for a second --output_dir path (a glob the shell expanded); as an
    option's own value (a JSON corpus for --dataset) it is still that value."""
    args_file = tmp_path / "run.json"
    args_file.write_text(json.dumps({"max_steps": 3}))
    with pytest.raises(ValueError, match=f"the arguments file {args_file} goes first, before the options: "
                                         f"minitx train {args_file} --output_dir o --seed 3"):
        parse_training_args(["--output_dir", "o", str(args_file), "--seed", "3"])
    _, data_args, _ = parse_training_args(["--dataset", str(args_file), "--output_dir", "o"])
    assert data_args.dataset == str(args_file)


@pytest.mark.parametrize("name, text", [("run.json", '{"max_steps": 2, "seed": 1, "max_steps": 3}'),
                                        ("run.yaml", "max_steps: 2\nseed: 1\nmax_steps: 3\n")])
def test_args_file_giving_a_name_twice_is_refused(tmp_path, name, text):
    """Both readers keep the last value silently; the run would not be the one the file seems to ask for."""
    args_file = tmp_path / name
    args_file.write_text(text)
    with pytest.raises(ValueError, match="gives max_steps more than once; keep one of each"):
        parse_training_args([str(args_file)])


@pytest.mark.parametrize("word, value", [("t", True), ("Y", True), ("yes", True), ("f", False), ("n", False)])
def test_a_flag_takes_the_same_words_in_a_file_in_overrides_and_on_the_command_line(tmp_path, word, value):
    from transformers.hf_argparser import string_to_bool

    from hf_minitx.training.model_presets import parse_config_overrides

    assert string_to_bool(word.lower()) is value  # the command line's reading
    args_file = tmp_path / "run.json"
    args_file.write_text(json.dumps({"calibrate_temperature": word}))
    assert parse_training_args([str(args_file)])[2].calibrate_temperature is value
    assert parse_config_overrides(f"qk_norm={word}") == {"qk_norm": value}


def test_args_file_with_an_unknown_key_is_refused(tmp_path):
    args_file = tmp_path / "run.json"
    args_file.write_text(json.dumps({"learning_rat": 0.1}))
    with pytest.raises(ValueError, match="unknown argument.*learning_rat"):
        parse_training_args([str(args_file)])


def test_args_file_typo_names_the_argument_it_resembles_not_all_seventy(tmp_path):
    args_file = tmp_path / "run.json"
    args_file.write_text(json.dumps({"max_stepz": 3}))
    with pytest.raises(ValueError) as error:
        parse_training_args([str(args_file)])
    assert "'max_stepz' (did you mean 'max_steps'?)" in str(error.value)
    assert "adam_beta1" not in str(error.value)  # not the whole list of arguments


def test_unknown_preset_lists_the_available_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown preset 'huge'(.|\n)*gpt2-small(.|\n)*tiny"):
        main(["--preset", "huge", "--output_dir", str(tmp_path / "x")])


def test_encoder_decoder_preset_with_causal_task_is_refused(tmp_path):
    with pytest.raises(ValueError, match="encoder-decoder.*--task seq2seq"):
        main(["--preset", "base", "--task", "causal-lm", "--output_dir", str(tmp_path / "x")])


def test_a_given_tokenizer_pads_on_the_side_of_the_model_it_trains(tmp_path, text_file):
    # one trained on a seq2seq corpus pads on the right; the decoder-only model's folder, its evaluation samples and
    # batched generation from it pad on the left
    from transformers import AutoTokenizer

    from hf_minitx.data.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(Path(text_file).read_text().splitlines(), 300, padding_side="right")
    tokenizer.save_pretrained(tmp_path / "tok")
    main(causal_args(text_file, tmp_path / "run", "--tokenizer", str(tmp_path / "tok"), "--max_steps", "2"))
    assert AutoTokenizer.from_pretrained(tmp_path / "run").padding_side == "left"
    assert AutoTokenizer.from_pretrained(tmp_path / "tok").padding_side == "right"  # the input is left as it was


@pytest.mark.slow
def test_seq2seq_sample_prompts_are_translated_in_place_of_the_first_validation_pairs(tmp_path):
    out = tmp_path / "s2s"
    main(seq2seq_args(out, "--max_steps", "2", "--sample_prompts", "seven|twelve", "--num_sample_generations", "2"))
    samples = json.loads((out / "training_summary.json").read_text())["sample_generations"]
    assert [s["prompt"] for s in samples] == ["seven", "twelve"]  # not the first validation pairs

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_minitx.inference import generate_texts

    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert [s["output"] for s in samples] == generate_texts(model, tokenizer, ["seven", "twelve"], max_new_tokens=32,
                                                           num_beams=1, do_sample=False, max_source_length=32)


def test_seq2seq_task_on_a_text_corpus_is_refused(tmp_path, text_file):
    with pytest.raises(ValueError, match="task/dataset mismatch"):
        main(["--task", "seq2seq", "--dataset", "builtin:pydocs", "--output_dir", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="task/dataset mismatch"):
        main(["--task", "seq2seq", "--dataset", str(text_file), "--output_dir", str(tmp_path / "y"),
              "--disable_tqdm"])
    assert not (tmp_path / "y" / "metrics.jsonl").exists()


def test_num_examples_with_a_corpus_it_does_not_size_is_refused_before_anything_is_written(tmp_path, text_file):
    """--num_examples sizes a generated task; a fixed corpus or a file would train on all of it without a word."""
    for dataset in ("builtin:pydocs", str(text_file)):
        with pytest.raises(ValueError, match=r"--num_examples sizes the generated built-in tasks \(builtin:numbers-"
                                             rf"en-fr, builtin:numbers-en-de\); {dataset} is read as it is"):
            main(["--dataset", dataset, "--num_examples", "50", "--max_steps", "2",
                  "--output_dir", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()
    from hf_minitx.data.tokenizer import TokenizerArguments, check_tokenizer_arguments

    with pytest.raises(ValueError, match="--num_examples sizes"):  # the tokenizer command's own check
        check_tokenizer_arguments(TokenizerArguments(output_dir=str(tmp_path / "t"), num_examples=50))


def test_block_size_beyond_the_position_table_is_refused(tmp_path):
    with pytest.raises(ValueError, match="block_size 512 is larger than the model's max_position_embeddings"):
        main(["--preset", "tiny", "--block_size", "512", "--output_dir", str(tmp_path / "x")])


def test_a_tokenizer_path_that_does_not_exist_is_said_so(tmp_path, text_file):
    with pytest.raises(FileNotFoundError, match="--tokenizer .*nope does not exist; give a saved tokenizer folder"):
        main(["--preset", "tiny", "--dataset", str(text_file), "--tokenizer", str(tmp_path / "nope"),
              "--output_dir", str(tmp_path / "x")])
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="tokenizer.json is not a folder"):
        main(["--preset", "tiny", "--dataset", str(text_file), "--tokenizer", str(tmp_path / "tokenizer.json"),
              "--output_dir", str(tmp_path / "y")])


@pytest.fixture
def previous_run(tmp_path) -> Path:
    """A folder where a run already logged a step."""
    out = tmp_path / "previous"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"type": "train", "step": 1, "loss": 5.0}) + "\n")
    return out


def test_output_dir_holding_another_run_is_refused(previous_run, text_file):
    """A resume is offered only where a checkpoint is there to go on from."""
    with pytest.raises(FileExistsError, match=r"already holds a run.*Pass --overwrite_output_dir to replace it, or "
                       r"choose another --output_dir"):
        main(causal_args(text_file, previous_run, "--max_steps", "1"))
    (previous_run / "checkpoint-1").mkdir()
    with pytest.raises(FileExistsError, match=r"already holds a run.*Pass --overwrite_output_dir to replace it \(or "
                       r"--resume_from_checkpoint latest to continue its run\), or choose another --output_dir"):
        main(causal_args(text_file, previous_run, "--max_steps", "1"))
    assert len((previous_run / "metrics.jsonl").read_text().splitlines()) == 1


def test_resume_latest_without_checkpoint_is_refused(previous_run, text_file):
    with pytest.raises(FileNotFoundError, match="no checkpoint-STEP folder"):
        main(causal_args(text_file, previous_run, "--max_steps", "1", "--resume_from_checkpoint", "latest"))


def test_checkpoint_from_another_config_is_refused(tmp_path, text_file):
    out = tmp_path / "run"
    other = causal_args(text_file, out, "--config_overrides", "hidden_size=64")
    model_args, data_args, train_args = parse_training_args(other)
    checkpoint = out / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    write_run_state(checkpoint, {**run_identity(resolve_model_settings(model_args, data_args), data_args,
                                                train_args.seed),
                                 "step": 2})
    with pytest.raises(ValueError, match="another configuration(.|\n)*hidden_size"):
        main(causal_args(text_file, out, "--max_steps", "4", "--resume_from_checkpoint", "latest"))


def test_invalid_model_override_is_refused(tmp_path):
    with pytest.raises(ValueError, match="hidden_size"):
        main(["--config_overrides", "hidden_size=30,num_attention_heads=4", "--output_dir", str(tmp_path / "x")])


@pytest.mark.parametrize("field", ["vocab_size", "eos_token_id"])
def test_an_override_of_what_the_tokenizer_decides_is_refused_not_dropped(tmp_path, capsys, field):
    args = ["train", "--config_overrides", f"hidden_size=32,{field}=10", "--output_dir", str(tmp_path / "x")]
    assert minitx(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--config_overrides {field}=... cannot be set" in err[0] and "--tokenizer" in err[0]
    assert not (tmp_path / "x").exists()


# --- minitx generate -----------------------------------------------------------------------------


def _generate_cli():
    import hf_minitx.inference as module  # `minitx generate`

    return module


@pytest.mark.slow
def test_generate_cli_samples_reproducibly_and_decodes_with_beams(causal_run, capsys):
    cli = _generate_cli()
    base = ["--model", str(causal_run), "--prompt", "the quick", "old stone", "--max_new_tokens", "8"]
    first = cli.main([*base, "--do_sample", "--top_k", "20", "--seed", "1", "--device", "cpu"])
    again = cli.main([*base, "--do_sample", "--top_k", "20", "--seed", "1", "--dtype", "float32"])
    assert first == again and len(first) == 2
    beams = cli.main([*base, "--num_beams", "3"])
    greedy = cli.main([*base, "--greedy"])
    assert all(isinstance(text, str) for text in beams + greedy)
    assert "the quick" in capsys.readouterr().out


def test_generate_cli_on_a_folder_without_model_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        _generate_cli().main(["--model", str(tmp_path), "--prompt", "hi"])


@pytest.mark.parametrize("loss, expected", [
    (math.log(300) - 0.2, "is at chance (perplexity"),  # near uniform: nothing learned
    (math.log(300) + 3.0, "is far worse than chance (perplexity"),  # confidently wrong: diverged, or by heart
    (float("inf"), "is far worse than chance"),
    (math.log(300) - 3.0, None),  # it learned
])
def test_the_end_of_run_warning_tells_a_diverged_model_from_an_untrained_one(loss, expected):
    from hf_minitx.training.evaluation import chance_note

    note = chance_note({"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700))}, 300)
    if expected is None:
        assert note is None
        return
    assert expected in note
    assert ("lower --learning_rate" in note and "Train longer" not in note) == ("far worse" in expected)
    # far worse than chance is also what a tiny corpus read thousands of times gives: the note names both causes
    assert ("learned its training text by heart" in note) == ("far worse" in expected)
