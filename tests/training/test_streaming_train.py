"""Training with --streaming: the --max_steps requirement, kill -9 then resume giving bit-identical weights,
and two processes reading disjoint parts of the stream."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import WRAPPERS_AT_GROUP_END, assert_same_weights, free_port, kill_then_resume

from hf_minitx.training.loop import main

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Four .txt files of distinct documents made of random words (no two blocks alike)."""
    rng = random.Random(0)
    vocabulary = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "ru", "ta", "po", "de")
                  for b in ("n", "r", "s", "l", "m")]
    folder = tmp_path_factory.mktemp("stream_corpus")
    for part in range(4):
        lines = [" ".join(rng.choices(vocabulary, k=rng.randint(6, 14))) + "." for _ in range(300)]
        (folder / f"part{part}.txt").write_text("\n".join(lines) + "\n")
    return folder


def stream_args(corpus: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--dataset", str(corpus / "*.txt"), "--streaming", "--preset", "tiny",
        "--config_overrides", "hidden_size=32,intermediate_size=64,max_position_embeddings=64,hidden_dropout=0.1",
        "--tokenizer_vocab_size", "300", "--block_size", "32", "--output_dir", str(output_dir),
        "--per_device_train_batch_size", "4", "--learning_rate", "3e-3", "--warmup_steps", "2", "--logging_steps", "1",
        "--eval_steps", "0", "--max_eval_samples", "8", "--num_sample_generations", "0", "--disable_tqdm",
        "--num_threads", "1", "--shuffle_buffer", "16", *extra,
    ]


def train_records(output_dir: Path) -> list[dict]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "train"]


def test_streaming_without_max_steps_or_a_budget_is_one_clear_error(corpus, tmp_path):
    with pytest.raises(ValueError, match="--streaming needs --max_steps or --max_minutes"):
        main(stream_args(corpus, tmp_path / "run"))
    with pytest.raises(ValueError, match="--num_epochs 1 cannot bound a --streaming run: .* give --max_steps"):
        main(stream_args(corpus, tmp_path / "run", "--max_minutes", "1", "--num_epochs", "1"))  # it bounded nothing
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_weights_of_an_uninterrupted_run(corpus, tmp_path):
    extra = ("--max_steps", "6", "--checkpointing_steps", "3", "--gradient_accumulation_steps", "2")
    straight, killed = tmp_path / "straight", tmp_path / "killed"

    def after_the_kill(folder: Path) -> None:
        assert (folder / "checkpoint-3" / "stream_state_0.npz").is_file()
        assert not (folder / "model.safetensors").exists()

    kill_then_resume(lambda folder: stream_args(corpus, folder, *extra), straight, killed, ENV, REPO, after_the_kill)
    assert_same_weights(straight, killed)
    assert [r["loss"] for r in train_records(straight)] == [r["loss"] for r in train_records(killed)]


@pytest.mark.slow
def test_two_processes_train_on_disjoint_parts_of_the_stream(corpus, tmp_path):
    from hf_minitx.data import load_corpus, load_tokenizer
    from hf_minitx.data.streaming import PackedBlockStream, load_stream_state

    out = tmp_path / "two"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port())]
    args = stream_args(corpus, out, "--max_steps", "5", "--checkpointing_steps", "5", "--warmup_steps", "5")
    (probe := tmp_path / "probe.py").write_text(WRAPPERS_AT_GROUP_END)
    done = subprocess.run([*launch, str(probe), "train", *args], env={**ENV, "WRAPPERS_RECORD": str(tmp_path)},
                          check=True, cwd=REPO, timeout=300, capture_output=True, text=True)
    assert json.loads((out / "training_summary.json").read_text())["num_processes"] == 2
    assert done.stderr.count("--warmup_steps 5 is cut to") == 1  # warned once, not per process
    # the wrapper went while its group was still registered: none left when the group is destroyed
    assert [(tmp_path / f"rank-{rank}").read_text() for rank in range(2)] == ["0", "0"]
    assert len(train_records(out)) == 5

    # Rebuild each process's stream and check that the saved positions are exactly after the blocks
    # that process trained on (5 steps x 4 rows), then that no block was trained on twice.
    rows = load_corpus(str(corpus / "*.txt"), streaming=True)["train"]
    tokenizer = load_tokenizer(str(out))
    trained = []
    for rank in range(2):
        saved = load_stream_state(out / "checkpoint-5" / f"stream_state_{rank}.npz")
        stream = PackedBlockStream(rows, tokenizer, 32, shuffle_buffer=16, seed=42, num_processes=2, process_index=rank)
        blocks = iter(stream)
        mine = [tuple(next(blocks).tolist()) for _ in range(saved["blocks_yielded"])]
        state = stream.state_dict()
        assert saved["blocks_yielded"] == 20 and saved["epoch"] == state["epoch"] == 0
        assert saved["rows"] == state["rows"] and saved["rng"] == state["rng"]
        assert np.array_equal(saved["carry"], state["carry"]) and np.array_equal(saved["buffer"], state["buffer"])
        trained.append(mine)
    everything = trained[0] + trained[1]
    assert len(set(everything)) == len(everything), "a block was trained on twice in the epoch"


def test_a_stream_too_short_for_one_block_leaves_the_output_folder_as_it_found_it(tmp_path):
    (data := tmp_path / "short").mkdir()
    for split in ("train", "validation"):
        (data / f"{split}.txt").write_text("hello world. " * 10 + "\n")
    args = ["--dataset", str(data), "--streaming", "--preset", "tiny", "--tokenizer_vocab_size", "300",
            "--block_size", "64", "--max_steps", "3", "--disable_tqdm", "--num_threads", "1"]
    with pytest.raises(ValueError, match="got no block of 64 tokens .*: use more data or a smaller --block_size"):
        main([*args, "--output_dir", str(tmp_path / "new")])
    assert not (tmp_path / "new").exists()  # not a folder of a marker and a tokenizer that refuses the next run
    old = tmp_path / "old"  # a finished run's folder, replaced by a run that fails at its first batch: it comes back
    main([*args[:3], "--preset", "tiny", "--tokenizer_vocab_size", "300", "--block_size", "16", "--max_steps", "1",
          "--disable_tqdm", "--num_threads", "1", "--eval_steps", "0", "--output_dir", str(old)])
    before = {p.relative_to(old): p.read_bytes() for p in old.rglob("*") if p.is_file() and p.name != ".minitx-lock"}
    with pytest.raises(ValueError, match="got no block"):
        main([*args, "--output_dir", str(old), "--overwrite_output_dir"])
    after = {p.relative_to(old): p.read_bytes() for p in old.rglob("*") if p.is_file() and p.name != ".minitx-lock"}
    assert after == before


@pytest.mark.slow
@pytest.mark.parametrize("cap", [[], ["--max_steps", "100000"]])
def test_a_time_budget_bounds_a_stream_and_its_plan_decays_to_the_end(corpus, tmp_path, monkeypatch, cap):
    from test_budget import TickingClock

    from hf_minitx.training import loop

    monkeypatch.setattr(loop, "time", TickingClock(0.004))
    out = tmp_path / "timed"
    main(stream_args(corpus, out, "--max_minutes", "0.05", *cap))
    summary = json.loads((out / "training_summary.json").read_text())
    plan = summary["time_budget"]
    assert plan["ended_by"] == "plan" and plan["planned_steps"] == plan["steps_run"] == summary["steps"] > 20
    assert summary["recipe"]["schedule"]["total_steps"] == plan["planned_steps"]
    assert summary["epochs"] is None and summary["stream_passes_completed"] >= 0  # a stream has no length to say
    rates = [r["learning_rate"] for r in train_records(out)]
    assert rates[-1] < 0.05 * max(rates)  # the decay ran to its end


def test_bad_bytes_in_the_first_window_leave_no_folder_and_promise_no_checkpoint(corpus, tmp_path, capsys):
    """Nothing was trained, so nothing is saved: the error said it had saved checkpoint-0 and told to resume it,
    while the folder the run made was removed."""
    from hf_minitx.cli import main as minitx
    from hf_minitx.data import train_bpe_tokenizer

    folder = tmp_path / "texts"
    (folder / "train").mkdir(parents=True)
    (folder / "validation").mkdir()
    text = (corpus / "part0.txt").read_text()
    (folder / "validation" / "v.txt").write_text(text)
    from hf_minitx.data.documents import TEXT_CHUNK_CHARS

    copies = TEXT_CHUNK_CHARS // len(text) + 2  # past the first row (setup reads it), inside the first window's read
    (folder / "train" / "t.txt").write_bytes(text.encode() * copies + b"caf\xe9\n" + text.encode())
    train_bpe_tokenizer([text], vocab_size=300).save_pretrained(tmp_path / "tok")
    args = stream_args(folder, tmp_path / "run", "--tokenizer", str(tmp_path / "tok"), "--max_steps", "4",
                       "--checkpointing_steps", "2")
    args[args.index("--dataset") + 1] = str(folder)  # its train/ and validation/ folders
    assert "--streaming" in args
    capsys.readouterr()
    assert minitx(["train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "t.txt is not UTF-8 text" in err[0] and "--skip_bad_rows" in err[0], err
    assert "saved" not in err[0] and not (tmp_path / "run").exists()


def test_a_streaming_resume_without_a_length_is_told_the_checkpoints(corpus, tmp_path):
    out = tmp_path / "run"
    main(stream_args(corpus, out, "--max_steps", "3", "--checkpointing_steps", "2"))
    (out / "model.safetensors").unlink()  # as if stopped after checkpoint-2
    with pytest.raises(ValueError, match=r"no length to count epochs from; the checkpoint's run was laid over 3 "
                                         r"steps: --max_steps 3 finishes it"):
        main(stream_args(corpus, out, "--resume_from_checkpoint", str(out / "checkpoint-2")))
