"""A resume goes on only with what its run began with, and says so before any work: the same files however they
are named, the same tokenizer (even with --accept_changed_inputs), the stream settings its position was saved with,
a run state that agrees with the scheduler's own count, and a checkpoint of the folder's own run. Arguments files
are typed as the command line is."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_safety import snapshot
from test_train import causal_args, text_file  # noqa: F401  (text_file is a fixture)

from hf_minitx.cli import main as minitx
from hf_minitx.folders import RUN_MARKER
from hf_minitx.training.loop import main as train_main


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def two_step_run(text_file, tmp_path_factory) -> Path:  # noqa: F811
    """A finished 2-step run with its checkpoint at step 2, trained on a copy of the corpus named corpus.txt."""
    folder = tmp_path_factory.mktemp("resume")
    shutil.copy(text_file, folder / "corpus.txt")
    train_main(causal_args(folder / "corpus.txt", folder / "run", "--max_steps", "2", "--checkpointing_steps", "2"))
    return folder / "run"


def resume_args(dataset: Path | str, run: Path, *extra: str) -> list[str]:
    return ["train", *causal_args(dataset, run, "--max_steps", "4", "--checkpointing_steps", "2",
                                  "--resume_from_checkpoint", "latest", *extra)]


def test_the_same_dataset_named_another_way_resumes_and_another_file_is_refused(two_step_run, tmp_path, capsys,
                                                                                monkeypatch):
    run, corpus = tmp_path / "run", two_step_run.parent / "corpus.txt"
    shutil.copytree(two_step_run, run)
    state = json.loads((run / "checkpoint-2" / "run_state.json").read_text())
    assert state["dataset"] == str(corpus) and list(state["input_files"]) == [str(corpus)]  # recorded resolved
    monkeypatch.chdir(corpus.parent)
    for field in ("dataset", "input_files"):  # a checkpoint of a run started with a relative path
        state[field] = "corpus.txt" if field == "dataset" else {"corpus.txt": state[field][str(corpus)]}
    (run / "checkpoint-2" / "run_state.json").write_text(json.dumps(state))
    other = tmp_path / "corpus.txt"
    shutil.copy(corpus, other)  # the same text, another file
    before = snapshot(run)
    assert minitx(resume_args(other, run)) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and f"dataset: checkpoint has 'corpus.txt', this run has '{other}'" in err[0]
    assert snapshot(run) == before
    assert minitx(resume_args("./corpus.txt", run)) == 0
    assert "resumed from" in capsys.readouterr().out
    assert json.loads((run / "checkpoint-4" / "run_state.json").read_text())["dataset"] == str(corpus)


def test_a_tokenizer_changed_mid_run_is_refused_even_with_accept_changed_inputs(text_file, tmp_path, capsys):  # noqa: F811
    tokenizer, run = tmp_path / "tok", tmp_path / "run"
    assert minitx(["train-tokenizer", "--dataset", str(text_file), "--vocab_size", "300", "--output_dir",
                   str(tokenizer)]) == 0
    train_main(causal_args(text_file, run, "--tokenizer", str(tokenizer), "--max_steps", "2",
                           "--checkpointing_steps", "2"))
    spec = json.loads((tokenizer / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[260:262]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # two tokens swap ids: same size, another mapping
    (tokenizer / "tokenizer.json").write_text(json.dumps(spec))
    before, _ = snapshot(run), capsys.readouterr()
    assert minitx(resume_args(text_file, run, "--tokenizer", str(tokenizer), "--accept_changed_inputs")) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and f"tokenizer file {tokenizer / 'tokenizer.json'} changed" in err[0], err
    assert "--accept_changed_inputs included" in err[0] and snapshot(run) == before


def test_a_run_state_edited_past_the_schedulers_count_is_called_damaged(two_step_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(two_step_run, run)
    state_file = run / "checkpoint-2" / "run_state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "step": 999999}))
    before = snapshot(run)
    assert minitx(resume_args(two_step_run.parent / "corpus.txt", run)) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "is damaged: run_state.json says step 999999, but its scheduler" in err[0], err
    assert "counted 2 steps" in err[0] and "--max_steps 999999" not in err[0] and snapshot(run) == before


def test_another_runs_checkpoint_in_a_folder_without_its_marker_is_refused(two_step_run, tmp_path, capsys):
    corpus, finished, other = two_step_run.parent / "corpus.txt", tmp_path / "finished", tmp_path / "other"
    shutil.copytree(two_step_run, other)
    train_main(causal_args(corpus, finished, "--max_steps", "2", "--seed", "7"))  # no checkpoint
    (finished / RUN_MARKER).unlink()
    shutil.copytree(other / "checkpoint-2", finished / "checkpoint-2")
    before = snapshot(finished)
    assert minitx(resume_args(corpus, finished, "--seed", "42")) == 2
    err = error_lines(capsys)
    own = json.loads((finished / "training_summary.json").read_text())["run_id"]
    assert len(err) == 1 and f"training_summary.json records run {own}" in err[0], err
    assert "copied from another run" in err[0] and snapshot(finished) == before


@pytest.mark.parametrize("values, message", [
    ({"max_steps": 2.5}, "max_steps must be a whole number (as --max_steps on the command line), got 2.5"),
    ({"max_steps": True}, "max_steps must be a whole number"),
    ({"task": "lm"}, "task must be one of causal-lm, seq2seq"),
    ({"streaming": "maybe"}, "streaming must be true or false"),
    ({"learning_rate": [0.1]}, "learning_rate must be a number"),
])
def test_an_arguments_file_is_typed_as_the_command_line(tmp_path, text_file, capsys, values, message):  # noqa: F811
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps(values))
    run = tmp_path / "run"
    assert minitx(["train", str(args_file), *causal_args(text_file, run)]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and f"arguments file {args_file}: {message}" in err[0], err
    assert not run.exists()


def test_typed_values_keep_whole_numbers_and_read_text_as_the_command_line():
    from hf_minitx.training.arguments import typed_values

    typed = typed_values({"max_steps": 2.0, "streaming": "no", "learning_rate": "1e-3", "dataset_config": None,
                          "seed": "7"}, "test")
    assert typed == {"max_steps": 2, "streaming": False, "learning_rate": 1e-3, "dataset_config": None, "seed": 7}
    assert isinstance(typed["max_steps"], int)


def test_an_is_encoder_decoder_override_against_the_task_names_the_override(tmp_path, text_file, capsys):  # noqa: F811
    args = causal_args(text_file, tmp_path / "run", "--max_steps", "1")
    at = args.index("--config_overrides") + 1
    args[at] += ",is_encoder_decoder=true"
    assert minitx(["train", *args]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and err[0].startswith(
        "error: --config_overrides is_encoder_decoder=true contradicts --task causal-lm"), err
    assert "preset" not in err[0] and "--task seq2seq" in err[0]


def test_a_streaming_resume_with_another_shuffle_buffer_is_refused_before_resuming(tmp_path, capsys, monkeypatch):
    import random

    from test_streaming_train import stream_args

    rng = random.Random(0)
    words = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne") for b in ("n", "r", "s")]
    for part in range(4):
        (tmp_path / f"part{part}.txt").write_text(
            "\n".join(" ".join(rng.choices(words, k=8)) + "." for _ in range(200)) + "\n")
    run = tmp_path / "run"
    train_main(stream_args(tmp_path, run, "--max_steps", "2", "--checkpointing_steps", "2"))
    before, _ = snapshot(run), capsys.readouterr()
    resume = ["train", *stream_args(tmp_path, run, "--max_steps", "4", "--resume_from_checkpoint", "latest")]
    assert minitx([*resume, "--shuffle_buffer", "8"]) == 2
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "was streamed with --shuffle_buffer 16, this run asks for 8" in err[0], err
    assert "resumed from" not in captured.out + captured.err and snapshot(run) == before
    monkeypatch.setitem(os.environ, "WORLD_SIZE", "2")  # as a launcher of two processes sets it
    assert minitx(resume) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "was streamed by 1 process(es), this launch has 2" in err[0], err


def test_a_moved_corpus_resumes_with_a_note_and_a_changed_one_is_still_refused(two_step_run, tmp_path, capsys):
    project = tmp_path / "project"
    shutil.copytree(two_step_run.parent, project)
    run, recorded = project / "run", two_step_run.parent / "corpus.txt"
    gone = tmp_path / "gone" / "corpus.txt"  # the run as recorded in a folder that was moved away
    state_file = run / "checkpoint-2" / "run_state.json"
    state = json.loads(state_file.read_text())
    state["dataset"], state["input_files"] = str(gone), {str(gone): state["input_files"][str(recorded)]}
    state_file.write_text(json.dumps(state))
    edited = tmp_path / "edited.txt"
    edited.write_text(recorded.read_text() + "one more line\n")
    before = snapshot(run)
    assert minitx(resume_args(edited, run)) == 2  # other text at a new path: not a move
    assert "comes from another configuration (dataset" in error_lines(capsys)[0]
    assert snapshot(run) == before
    assert minitx(resume_args(project / "corpus.txt", run)) == 0
    out = capsys.readouterr().out
    assert f"note: {gone} is read from {project / 'corpus.txt'} now (the same size and content)" in out
    assert "resumed from" in out and (run / "checkpoint-4").is_dir()


def test_datasets_own_cache_files_in_a_saved_dataset_are_no_input(tmp_path):
    import datasets

    from hf_minitx.training.arguments import DataArguments
    from hf_minitx.training.run_plan import fingerprint_inputs

    datasets.Dataset.from_dict({"text": ["some text"] * 20}).save_to_disk(str(tmp_path / "saved"))
    args = DataArguments(dataset=str(tmp_path / "saved"))
    before = fingerprint_inputs(args)
    (tmp_path / "saved" / "cache-71d29c719e8f5df8.arrow").write_bytes(b"written by datasets' map")
    assert fingerprint_inputs(args) == before and before  # a resume sees the same inputs
    (tmp_path / "saved" / "notes.arrow").write_bytes(b"the user's")
    assert fingerprint_inputs(args) != before


def test_an_input_still_on_disk_but_not_read_by_the_resume_is_named_as_such_not_as_gone(tmp_path):
    """A copied run folder reads its own copies (a student's teacher) while the checkpoint names the original's:
    the original is there, so "gone" would send the user looking for a file that exists."""
    from hf_minitx.training.checkpoints import check_same_inputs

    original, copy = tmp_path / "run" / "teacher" / "README.md", tmp_path / "copy" / "teacher" / "README.md"
    for path in (original, copy):
        path.parent.mkdir(parents=True)
        path.write_text("the teacher's card")
    stored, expected = {"input_files": {str(original): "12:abc"}}, {"input_files": {str(copy): "12:abc"}}
    with pytest.raises(ValueError, match=rf"input file {original} is not among this resume's inputs since .*a copied "
                                         r"run folder reads its own copies: resume the original"):
        check_same_inputs(tmp_path / "copy" / "checkpoint-2", stored, expected)
    original.unlink()  # gone for real: the copy is the same file moved, and the run goes on with it
    check_same_inputs(tmp_path / "copy" / "checkpoint-2", stored, expected)
