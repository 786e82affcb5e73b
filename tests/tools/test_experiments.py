"""The toy experiments: data of the copy and reverse tasks, schedules, label smoothing, run outputs, and
(slow) the copy task learned to 100% exact match with a clean diagonal cross-attention."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_minitx.tools import visualize as viz
from hf_minitx.tools.experiments import (
    PRESETS,
    ExperimentConfig,
    compare,
    make_batch,
    make_scheduler,
    run_experiment,
)

REPO = Path(__file__).resolve().parents[2]

TINY = dict(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, batch_size=8, steps=6, log_every=2,
            eval_every=3, eval_examples=8, stop_at_exact_match=None, max_length=5)


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_batches_hold_the_task(task):
    config = ExperimentConfig(task=task, vocab_size=12, min_length=2, max_length=6)
    batch = make_batch(config, 32, torch.Generator().manual_seed(0))
    assert batch["input_ids"].shape == batch["labels"].shape == (32, 7)
    lengths = set()
    for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"], strict=True):
        n = int(mask.sum()) - 1  # tokens before EOS
        lengths.add(n)
        tokens = ids[:n]
        assert 2 <= n <= 6 and ids[n] == 2 and labels[n] == 2
        assert torch.all((tokens >= 4) & (tokens < 12))
        expected = tokens if task == "copy" else tokens.flip(0)
        assert torch.equal(labels[:n], expected)
        assert torch.all(ids[n + 1:] == 0) and torch.all(labels[n + 1:] == -100)
    assert len(lengths) > 1, "lengths vary"


def test_same_seed_same_data():
    config = ExperimentConfig()
    first = make_batch(config, 4, torch.Generator().manual_seed(3))
    second = make_batch(config, 4, torch.Generator().manual_seed(3))
    assert torch.equal(first["input_ids"], second["input_ids"])


def test_inverse_sqrt_schedule_warms_up_then_decays():
    config = ExperimentConfig(learning_rate=1e-3, warmup_steps=10, steps=100)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate)
    scheduler = make_scheduler(config, optimizer)
    rates = []
    for _ in range(41):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates[5] == pytest.approx(5e-4)  # linear warmup
    assert max(rates) == pytest.approx(1e-3) and int(np.argmax(rates)) == 10
    assert rates[40] == pytest.approx(1e-3 * (10 / 40) ** 0.5)  # 1/sqrt(step) decay


@pytest.mark.parametrize("kwargs, match", [
    ({"task": "sort"}, "task"), ({"schedule": "step"}, "schedule"), ({"vocab_size": 5}, "vocab_size"),
    ({"min_length": 6, "max_length": 3}, "min_length"), ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"steps": 0}, "steps"), ({"warmup_steps": -1}, "warmup_steps must be 0 \\(none\\) or more"),
    ({"initializer_range": 0.0}, "initializer_range"), ({"max_length": 100_000}, "max_length must be at most 512"),
    ({"stop_at_exact_match": 150.0}, "a percentage in \\(0, 100\\]"),
    # drawn up front or allocated: these filled memory, then ended in a traceback
    ({"steps": 10**17}, "steps x batch_size asks for"), ({"eval_examples": 10**8}, "eval_examples asks for"),
    ({"vocab_size": 10**11}, "parameters, more than a toy task trains"),
    ({"hidden_size": 16384, "num_heads": 1}, "parameters, more than a toy task trains"),
])
def test_bad_settings_are_explained(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ExperimentConfig(**kwargs)


def test_run_writes_metrics_the_plots_read(tmp_path):
    config = ExperimentConfig(**TINY, output_dir=str(tmp_path / "run"))
    summary = run_experiment(config)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["step"] for r in train] == [2, 4, 6] and [r["step"] for r in evals] == [3, 6]
    assert set(train[0]) == {"type", "step", "epoch", "loss", "learning_rate", "tokens_per_second", "tokens_seen",
                             "elapsed_seconds"}
    assert 0.0 <= evals[-1]["eval_exact_match"] <= 100.0 and evals[-1]["eval_loss"] > 0
    assert summary["final_metrics"] == {k: v for k, v in evals[-1].items() if k.startswith("eval_")}
    saved = json.loads((tmp_path / "run" / "training_summary.json").read_text())
    assert saved["steps"] == 6 and saved["experiment"]["task"] == "copy"
    data = viz.plot_training(tmp_path / "run", tmp_path / "curves.png")["run"]
    np.testing.assert_array_equal(data["train_step"], [2, 4, 6])
    cross = viz.plot_attention(str(tmp_path / "run"), source="4 5 6", target="4 5 6", out=tmp_path / "a.png",
                               kinds=["cross"])["cross"]
    assert cross.shape == (1, 2, 4, 4)


def test_label_smoothing_changes_the_training_loss(tmp_path):
    def first_loss(smoothing: float) -> float:
        config = ExperimentConfig(**{**TINY, "steps": 2, "log_every": 1}, label_smoothing=smoothing,
                                  output_dir=str(tmp_path / f"ls{smoothing}"))
        run_experiment(config)
        return viz.read_metrics(tmp_path / f"ls{smoothing}")["train_loss"][0]

    plain, smoothed = first_loss(0.0), first_loss(0.1)
    # same seed and data: at step 1 the model is identical, only the loss definition differs
    assert plain != pytest.approx(smoothed, abs=1e-4)


def test_compare_runs_same_data_side_by_side(tmp_path):
    config = ExperimentConfig(**TINY)
    summaries = compare(config, "norm_position", ["post", "pre"], tmp_path)
    assert list(summaries) == ["norm_position=post", "norm_position=pre"]
    post = json.loads((tmp_path / "norm_position-post" / "config.json").read_text())
    assert post["norm_position"] == "post"
    assert (tmp_path / "comparison.png").stat().st_size > 1000
    tokens = [viz.read_metrics(tmp_path / f"norm_position-{v}")["tokens_per_second"].size for v in ("post", "pre")]
    assert tokens == [3, 3]
    with pytest.raises(ValueError, match="at least two values"):
        compare(config, "norm_position", ["pre"], tmp_path)
    with pytest.raises(ValueError, match="Cannot compare"):
        compare(config, "colour", ["a", "b"], tmp_path)


def test_compare_puts_architecture_options_side_by_side(tmp_path):
    import hf_minitx.tools.experiments as cli  # `minitx experiment`
    argv = [f"--{k}={v}" for k, v in TINY.items() if k != "stop_at_exact_match"]
    summaries = cli.main([*argv, "--stop_at_exact_match", "none", "--hidden_act", "relu2", "--final_logit_softcap",
                          "5", "--compare", "qk_norm", "false", "true", "--output_dir", str(tmp_path)])
    assert list(summaries) == ["qk_norm=False", "qk_norm=True"]
    for value in (False, True):
        saved = json.loads((tmp_path / f"qk_norm-{value}" / "config.json").read_text())
        assert (saved["qk_norm"], saved["hidden_act"], saved["final_logit_softcap"]) == (value, "relu2", 5.0)
    assert cli._convert("norm_type", ["layernorm", "rmsnorm"]) == ["layernorm", "rmsnorm"]
    assert cli._convert("final_logit_softcap", ["none", "30"]) == [None, 30.0]
    with pytest.raises(ValueError, match="true or false"):
        cli._convert("qk_norm", ["maybe", "true"])
    with pytest.raises(ValueError, match="choose one of \\('layernorm', 'rmsnorm'\\)"):
        ExperimentConfig(**TINY, norm_type="batchnorm")


def test_cli_overrides_and_compare(tmp_path, capsys):
    import hf_minitx.tools.experiments as cli  # `minitx experiment`
    argv = [f"--{k}={v}" for k, v in TINY.items() if k != "stop_at_exact_match"]
    summaries = cli.main([*argv, "--stop_at_exact_match", "none", "--compare", "label_smoothing", "0.0", "0.1",
                          "--output_dir", str(tmp_path)])
    assert [s["experiment"]["label_smoothing"] for s in summaries.values()] == [0.0, 0.1]
    assert "exact match" in capsys.readouterr().out
    with pytest.raises(ValueError, match="at least two values"):
        cli.main(["--compare", "norm_position", "pre"])
    for argv, said in ((["--compare", "hidden_size", "32", "abc"], r"hidden_size: values must be whole numbers, got "
                                                                   r"\['32', 'abc'\]"),
                       (["--compare", "max_grad_norm", "1", "x"], "max_grad_norm: values must be numbers or none"),
                       (["--threads", "0"], "--threads must be from 1 to"),
                       (["--threads", "99999"], "--threads must be from 1 to")):  # a segfault in libgomp
        with pytest.raises(ValueError, match=said):
            cli.main([*argv, "--output_dir", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()


def test_an_experiment_under_a_launch_of_several_processes_is_refused_before_any_folder(tmp_path, monkeypatch):
    import hf_minitx.tools.experiments as cli  # `minitx experiment`
    monkeypatch.setenv("WORLD_SIZE", "2")  # what accelerate launch --num_processes 2 gives each process
    with pytest.raises(ValueError, match="in one process: run it without accelerate launch"):
        cli.main(["--output_dir", str(tmp_path / "ex")])
    assert not (tmp_path / "ex").exists()


@pytest.mark.slow
def test_copy_task_learned_with_diagonal_cross_attention(tmp_path):
    config = dataclasses.replace(PRESETS["copy"], output_dir=str(tmp_path / "copy"))
    summary = run_experiment(config)
    assert summary["final_metrics"]["eval_exact_match"] == 100.0
    assert summary["seconds_to_exact_match"] is not None
    source = "5 9 7 4 12 6 15 8"
    data = viz.plot_attention(str(tmp_path / "copy"), source=source, target=source, out=tmp_path / "cross.png",
                              kinds=["cross"])
    last_layer = data["cross"][-1].mean(0)  # (target, source), averaged over heads
    # predicting output token t, the model looks at source token t
    assert np.array_equal(last_layer.argmax(-1), np.arange(len(source.split()) + 1))


def test_compare_adamw_and_muon_side_by_side(tmp_path, capsys):
    import hf_minitx.tools.experiments as cli  # `minitx experiment --compare optimizer adamw muon`

    argv = [f"--{k}={v}" for k, v in TINY.items() if k != "stop_at_exact_match"]
    summaries = cli.main([*argv, "--stop_at_exact_match", "none", "--compare", "optimizer", "adamw", "muon",
                          "--output_dir", str(tmp_path)])
    assert list(summaries) == ["optimizer=adamw", "optimizer=muon"]
    adamw, muon = (summaries[f"optimizer={name}"]["recipe"] for name in ("adamw", "muon"))
    assert adamw["optimizer"] == "adamw" and {g["optimizer"] for g in adamw["parameter_groups"]} == {"AdamW"}
    assert muon["optimizer"] == "muon" and muon["parameter_groups"][0]["optimizer"] == "Muon"
    assert muon["parameter_groups"][0]["learning_rate"] == ExperimentConfig().muon_learning_rate
    saved = json.loads((tmp_path / "optimizer-muon" / "training_summary.json").read_text())
    assert saved["recipe"]["parameter_groups"] == muon["parameter_groups"]
    last = [viz.read_metrics(tmp_path / f"optimizer-{v}")["train_loss"][-1] for v in ("adamw", "muon")]
    assert last[0] != last[1]  # same data and seed, different optimizers
    assert (tmp_path / "comparison.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="optimizer 'sgd' is not known"):
        ExperimentConfig(optimizer="sgd")


def test_the_presets_are_json_files_of_config_fields_each_with_its_description():
    from hf_minitx.tools.experiments import PRESET_FILES, ExperimentConfig

    names = {f.name for f in dataclasses.fields(ExperimentConfig)}
    files = {f.name.removesuffix(".json"): json.loads(f.read_text()) for f in PRESET_FILES.iterdir()
             if f.name.endswith(".json")}
    assert set(files) == set(PRESETS) >= {"copy", "reverse", "norm-position"}
    for name, values in files.items():
        assert values.pop("description").strip(), name
        assert set(values) <= names, name
        assert all(getattr(PRESETS[name], key) == value for key, value in values.items()), name
    assert PRESETS["norm-position"].max_grad_norm is None and PRESETS["norm-position"].num_layers == 6


def test_the_choice_fields_help_lists_what_the_registries_hold():
    # a new position encoding, norm, activation, optimizer or schedule shows up in `minitx experiment --help`
    from hf_minitx.models.configuration_minitx import HIDDEN_ACTS, NORM_TYPES, POSITION_KINDS
    from hf_minitx.tools.experiments import SCHEDULES, ExperimentConfig
    from hf_minitx.training.optim import OPTIMIZERS

    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(ExperimentConfig)}
    for name, registry in (("position_embedding_type", POSITION_KINDS), ("norm_type", NORM_TYPES),
                           ("hidden_act", HIDDEN_ACTS), ("optimizer", OPTIMIZERS), ("schedule", SCHEDULES)):
        assert registry and all(choice in helps[name] for choice in registry), name
    assert "warmup_stable_decay" in SCHEDULES and "inverse_sqrt" in SCHEDULES
