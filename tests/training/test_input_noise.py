"""--input_noise: causal-lm input tokens replaced by tokens of the same batch, the targets kept; its checks, its
record and an exact resume."""

from __future__ import annotations

import json

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from conftest import assert_same_weights
from test_train import (  # noqa: F401  (fixtures)
    _fresh_accelerate_state,
    causal_args,
    records,
    resume_from_copy,
    seq2seq_args,
    text_file,
)

from hf_minitx.training.loop import main
from hf_minitx.training.loss import Objective, replace_tokens


def test_replace_tokens_replaces_about_the_share_asked_with_tokens_of_the_batch():
    ids = torch.randint(0, 50, (4, 500), generator=torch.Generator().manual_seed(0))
    assert torch.equal(replace_tokens(ids, 0.0), ids)
    torch.manual_seed(1)
    noisy = replace_tokens(ids, 0.3)
    changed = (noisy != ids).float().mean().item()
    assert 0.25 < changed < 0.32  # 0.3, less the draws that hit the same id (about 1 in 50)
    assert set(noisy.unique().tolist()) <= set(ids.unique().tolist())
    torch.manual_seed(1)
    assert torch.equal(replace_tokens(ids, 0.3), noisy)  # the global generator decides: a resume draws the same


def test_the_objective_noises_the_inputs_and_keeps_the_labels():
    ids = torch.randint(3, 300, (2, 64), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    noisy = Objective.for_task("causal-lm", input_noise=0.5).model_inputs(batch)
    assert "labels" not in noisy and (noisy["input_ids"] != ids).any()
    assert torch.equal(batch["labels"], ids) and torch.equal(batch["input_ids"], ids)  # the batch is not touched
    assert torch.equal(Objective.for_task("causal-lm").model_inputs(batch)["input_ids"], ids)


def test_evaluation_reads_the_text_without_the_training_noise():
    """The noise is a training regulariser: the validation loss (and so the kept weights) is of the true text."""
    from types import SimpleNamespace

    from hf_minitx.training.setup import build_evaluation

    plan = SimpleNamespace(
        objective=Objective.for_task("causal-lm", input_noise=0.5),
        train_args=SimpleNamespace(num_sample_generations=0, seed=0, generation_num_beams=1,
                                   per_device_eval_batch_size=2),
        data_args=SimpleNamespace(max_target_length=8, max_source_length=8, max_eval_samples=None, streaming=False))
    data = SimpleNamespace(prompts=[], sources=[], references=[], num_bytes=10, validation=[0, 1])
    evaluation = build_evaluation(plan, data, tokenizer=None, eval_loader=[])
    ids = torch.randint(3, 300, (2, 64), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    assert torch.equal(evaluation.objective.model_inputs(batch)["input_ids"], ids)
    assert plan.objective.input_noise == 0.5  # the training objective keeps it


@pytest.mark.parametrize("noise", ["1.0", "-0.1"])
def test_a_noise_share_outside_zero_to_one_is_refused_before_any_write(text_file, tmp_path, noise):  # noqa: F811
    with pytest.raises(ValueError, match=r"--input_noise must be in \[0, 1\)"):
        main(causal_args(text_file, tmp_path / "run", "--input_noise", noise))
    assert not (tmp_path / "run").exists()


def test_seq2seq_with_input_noise_is_refused_before_any_write(tmp_path):
    with pytest.raises(ValueError, match="--input_noise replaces causal-lm input tokens; with --task seq2seq"):
        main(seq2seq_args(tmp_path / "run", "--input_noise", "0.1"))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_noised_run_is_recorded_differs_and_resumes_to_the_weights_of_a_straight_run(text_file, tmp_path):  # noqa: F811
    extra = ("--max_steps", "4", "--checkpointing_steps", "2", "--input_noise", "0.2")
    straight, resumed, clean = tmp_path / "straight", tmp_path / "resumed", tmp_path / "clean"
    main(causal_args(text_file, straight, *extra))
    assert json.loads((straight / "training_summary.json").read_text())["recipe"]["input_noise"] == 0.2
    resume_from_copy(straight, resumed)
    main(causal_args(text_file, resumed, *extra, "--resume_from_checkpoint", "latest"))
    assert_same_weights(straight, resumed)
    assert [r["loss"] for r in records(straight, "train")] == [r["loss"] for r in records(resumed, "train")]
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    main(causal_args(text_file, clean, "--max_steps", "4"))
    assert records(clean, "train")[1]["loss"] != records(straight, "train")[1]["loss"]
