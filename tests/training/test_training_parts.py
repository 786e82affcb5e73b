"""The pieces under the training loop: data order, token-count loss, presets,
checkpoint bookkeeping, device/dtype choice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hf_minitx.data.preprocessing import BlockCollator
from hf_minitx.device import pick_device, pick_dtype
from hf_minitx.training.checkpoints import list_checkpoints, rotate_checkpoints, write_run_state
from hf_minitx.training.data_order import ShiftedWindows, StepIndexedBatchSampler
from hf_minitx.training.evaluation import exact_match
from hf_minitx.training.loss import Objective, count_label_tokens, sequence_cross_entropy, token_cross_entropy
from hf_minitx.training.model_presets import available_presets, load_preset, parse_config_overrides
from hf_minitx.training.outputs import append_metrics, read_metrics, truncate_metrics


def _take(sampler, n):
    iterator = iter(sampler)
    return [next(iterator) for _ in range(n)]


def test_two_processes_split_each_global_batch_of_one_process():
    one = _take(StepIndexedBatchSampler(50, 8, seed=3), 12)
    ranks = [_take(StepIndexedBatchSampler(50, 4, num_processes=2, process_index=p, seed=3), 12) for p in (0, 1)]
    assert [a + b for a, b in zip(*ranks, strict=True)] == one


def test_start_offset_continues_the_same_order_across_epochs():
    full = _take(StepIndexedBatchSampler(30, 7, seed=1), 10)  # 4 batches per epoch: crosses 2 epochs
    assert _take(StepIndexedBatchSampler(30, 7, seed=1, start=6), 4) == full[6:]


def test_each_epoch_visits_distinct_rows_in_a_new_order():
    batches = _take(StepIndexedBatchSampler(20, 5, seed=0), 8)
    first, second = sum(batches[:4], []), sum(batches[4:], [])
    assert sorted(first) == sorted(second) == list(range(20))
    assert first != second


def test_shifted_windows_draw_new_offsets_each_epoch_and_resume_at_the_same_pairs():
    batches = _take(StepIndexedBatchSampler(21, 5, seed=0, window=16), 8)  # 20 rows continue into a next one
    first, second = sum(batches[:4], []), sum(batches[4:], [])
    assert sorted(row for row, _ in first) == sorted(row for row, _ in second) == list(range(20))
    assert all(0 <= offset < 16 for _, offset in first + second)
    assert dict(first) != dict(second) and len(set(dict(first).values())) > 1  # other cuts, epoch to epoch
    assert _take(StepIndexedBatchSampler(21, 5, seed=0, window=16, start=5), 3) == batches[5:]
    ranks = [_take(StepIndexedBatchSampler(21, 2, num_processes=2, process_index=p, window=16), 6) for p in (0, 1)]
    assert [a + b for a, b in zip(*ranks, strict=True)] == _take(StepIndexedBatchSampler(21, 4, window=16), 6)


def test_a_shifted_window_is_the_packed_text_from_its_offset_on():
    import datasets

    text = torch.arange(5 * 8).reshape(5, 8)  # five packed blocks of 8 tokens, back to back
    windows = ShiftedWindows(datasets.Dataset.from_dict({"input_ids": text.tolist()}))
    for row, offset in [(0, 0), (0, 5), (3, 7), (2, 1)]:
        start = row * 8 + offset
        assert windows[row, offset].tolist() == list(range(start, start + 8))
    batch = BlockCollator(None)([windows[1, 3], windows[0, 0]])  # the loop's collator takes windows as rows
    assert batch["input_ids"].tolist() == [list(range(11, 19)), list(range(8))]


def test_batch_larger_than_the_data_is_refused():
    with pytest.raises(ValueError, match="fewer than one global batch"):
        StepIndexedBatchSampler(10, 8, num_processes=2)


def test_a_text_shorter_than_a_batch_of_blocks_is_refused_in_blocks_before_any_write(tmp_path, capsys):
    """A batch of one that the text cannot fill names the block size, not the batch size it cannot lower."""
    from hf_minitx.cli import main

    text = tmp_path / "short.txt"
    text.write_text("\n".join(f"line {i}" for i in range(40)), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["train", "--dataset", str(text), "--preset", "tiny", "--tokenizer_vocab_size", "300",
                 "--per_device_train_batch_size", "1", "--max_steps", "1", "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "packs into 1 block of --block_size 128 tokens, and a global batch of 1" in err
    assert "needs 2 (a shifted window reads on into the next block)" in err
    assert "a smaller --block_size" in err and "--per_device_train_batch_size" not in err.split("needs")[1]
    assert not out.exists()


def test_summed_loss_is_the_mean_loss_times_the_token_count():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11)
    labels = torch.randint(0, 11, (3, 7))
    labels[0, 4:] = -100
    for shift in (True, False):
        count = count_label_tokens(labels, shift)
        mean = token_cross_entropy(*((logits[:, :-1], labels[:, 1:]) if shift else (logits, labels)))
        summed = Objective(shift=shift).summed_loss(logits, labels)
        assert summed == pytest.approx(mean.item() * count.item(), rel=1e-5)
        rows, counts = sequence_cross_entropy(logits, labels, shift=shift)
        assert rows.sum().item() == pytest.approx(mean.item() * count.item(), rel=1e-5)
        assert counts.tolist() == ([3, 6, 6] if shift else [4, 7, 7])


def test_the_shifted_loss_has_the_gradient_of_the_sliced_logits_and_none_on_the_last_position():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 9, requires_grad=True)
    labels = torch.randint(0, 9, (2, 6))
    Objective(shift=True).summed_loss(logits, labels).backward()
    sliced = logits.detach()[:, :-1].clone().requires_grad_(True)
    token_cross_entropy(sliced, labels[:, 1:], reduction="sum").backward()
    assert torch.allclose(logits.grad[:, :-1], sliced.grad, atol=1e-6)
    assert logits.grad[:, -1].abs().max() == 0


def test_label_smoothing_raises_the_loss_of_confident_predictions():
    logits = torch.full((1, 4, 5), -10.0)
    labels = torch.tensor([[0, 1, 2, 3]])
    logits[0, torch.arange(4), labels[0]] = 10.0
    plain = Objective(shift=False).summed_loss(logits, labels)
    smooth = Objective(shift=False, label_smoothing=0.1).summed_loss(logits, labels)
    assert smooth > plain + 1.0


def test_presets_are_valid_and_overrides_parse():
    names = available_presets()
    assert {"tiny", "small", "gpt2-small", "base"} <= set(names)
    gpt2 = load_preset("gpt2-small")
    assert (gpt2["hidden_size"], gpt2["num_hidden_layers"], gpt2["max_position_embeddings"]) == (768, 12, 1024)
    assert load_preset("base")["norm_position"] == "post"
    assert parse_config_overrides("hidden_size=128, hidden_act=relu,hidden_dropout=0.1") == {
        "hidden_size": 128, "hidden_act": "relu", "hidden_dropout": 0.1}
    with pytest.raises(ValueError, match="name=value"):
        parse_config_overrides("hidden_size")


def test_rotation_keeps_the_newest_checkpoints_by_step(tmp_path):
    for step in (2, 10, 4):
        write_run_state(_mk(tmp_path / f"checkpoint-{step}"), {"step": step})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-4", "checkpoint-10"]
    rotate_checkpoints(tmp_path, 2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-10"]


def _mk(path):
    path.mkdir(parents=True)
    return path


def test_resumed_metrics_drop_the_records_after_the_checkpoint(tmp_path):
    for step in (1, 2, 3):
        append_metrics(tmp_path, {"type": "train", "step": step, "loss": float(step)})
    append_metrics(tmp_path, {"type": "eval", "step": 3, "eval_loss": float("nan")})
    truncate_metrics(tmp_path, 2)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    # a kill after the last step's checkpoint, during the temperature's evaluation: the resume fits it again
    append_metrics(tmp_path, {"type": "eval", "step": 2, "eval_loss": 3.0})
    append_metrics(tmp_path, {"type": "eval", "step": 2, "temperature": 1.1, "eval_loss": 2.9})
    truncate_metrics(tmp_path, 2)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("eval_loss")) for r in lines] == [(1, None), (2, None), (2, 3.0)]


def test_a_metrics_line_that_is_not_utf8_is_named_and_a_resume_drops_it(tmp_path):
    for step in (1, 2):
        append_metrics(tmp_path, {"type": "train", "step": step, "loss": float(step)})
    with (tmp_path / "metrics.jsonl").open("ab") as handle:
        handle.write(b'{"type": "train", "step": 3, "lo\xffss": 1.0}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:3 is not UTF-8 \(byte 0xff at column 33\); metrics"):
        read_metrics(tmp_path)
    truncate_metrics(tmp_path, 2)
    assert list(read_metrics(tmp_path)["train_step"]) == [1, 2]


def test_the_curves_leave_out_the_evaluation_of_the_fitted_temperature(tmp_path):
    """The calibrated model's record scores other logits than training made: not a point of the validation line."""
    append_metrics(tmp_path, {"type": "train", "step": 6, "loss": 7.9})
    append_metrics(tmp_path, {"type": "eval", "step": 6, "eval_loss": 7.63})
    append_metrics(tmp_path, {"type": "eval", "step": 6, "temperature": 0.5, "eval_loss": 7.17})
    metrics = read_metrics(tmp_path)
    assert list(metrics["eval_step"]) == [6] and list(metrics["eval_loss"]) == [7.63]


def test_exact_match_is_a_percentage():
    assert exact_match(["a b", "c"], ["a b ", "d"]) == 50.0
    with pytest.raises(ValueError):
        exact_match(["a"], [])


KEEP_PROBE = """
import resource, sys, torch
from hf_minitx.device import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
for _ in range(3):  # warm up: the first allocations fault in either case
    torch.ones(2048, 4096)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.ones(2048, 4096)  # 32 MiB, freed at once
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings: Linux only")
def test_kept_freed_memory_is_reused_without_page_faults():
    runs = {}
    for mode in ("keep", "default"):
        out = subprocess.run([sys.executable, "-c", KEEP_PROBE, mode], capture_output=True, text=True, check=True)
        kept, faults = out.stdout.split()
        runs[mode] = (kept == "True", int(faults))
    assert runs["keep"][0], "keep_freed_memory() could not set glibc's thresholds"
    # 20 fresh 32 MiB blocks fault in ~8192 pages each by default; kept memory is already resident (a few blocks
    # may land on new pages while the heap settles: 0 to 4 of the 20 were seen).
    assert runs["default"][1] > 20 * 4000
    assert runs["keep"][1] < runs["default"][1] / 3


def test_device_and_dtype_choice_on_this_machine():
    device = pick_device("cpu")
    assert device.type == "cpu"
    assert pick_dtype(device) == torch.float32
    assert pick_dtype(device, "bf16") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        pick_dtype(device, "float8")
    if not torch.cuda.is_available():
        assert pick_device().type in ("cpu", "mps")
        with pytest.raises(ValueError, match="CUDA is not available"):
            pick_device("cuda")


def test_a_seq2seq_step_computes_its_loss_once(monkeypatch):
    """The trainer's seq2seq inputs carry no labels (the model computes no loss of its own) and give the same
    logits as the model's own teacher forcing from the labels."""
    from hf_minitx import MiniTxConfig, MiniTxForConditionalGeneration

    config = MiniTxConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=16, is_encoder_decoder=True,
                          decoder_start_token_id=1, pad_token_id=0)
    model = MiniTxForConditionalGeneration(config).eval()
    batch = {"input_ids": torch.randint(3, 40, (2, 6)), "attention_mask": torch.ones(2, 6, dtype=torch.long),
             "labels": torch.tensor([[5, 6, 7, -100], [8, 9, -100, -100]])}
    objective = Objective.for_task("seq2seq", 0.0, config)
    calls = []
    monkeypatch.setattr(type(model), "loss_function", property(lambda self: lambda *a, **k: calls.append(1)))
    inputs = objective.model_inputs(batch)
    assert "labels" not in inputs
    out = model(**inputs)
    assert out.loss is None and calls == []
    monkeypatch.undo()
    reference = model(**batch)
    torch.testing.assert_close(out.logits, reference.logits)
    torch.testing.assert_close(objective.summed_loss(out.logits, batch["labels"]) / 5, reference.loss)
    with pytest.raises(ValueError, match="config"):
        Objective.for_task("seq2seq")
