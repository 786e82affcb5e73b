"""The quality comparison's checks before any training (corpora, our side's arguments, the output files and the
work folder), the figures a work folder keeps across an interruption, and the one-line errors of a side that
failed. No training: the sides are stood in for where a test needs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from hf_minitx.cli import Interrupted
from hf_minitx.tools.benchmark import quality, run
from hf_minitx.tools.benchmark.quality import child_error, run_quality
from hf_minitx.tools.benchmark.quality_report import format_quality
from hf_minitx.tools.benchmark.quality_settings import (
    MIN_CORPUS_CHARS,
    SETTINGS_FILE,
    QualitySettings,
    check_work_dir,
    claim_work_dir,
)

TEXT = "".join(f"line {i}: the cat sat on the mat, and the dog ran {i * 7} laps.\n" for i in range(400))


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    assert len(TEXT) >= MIN_CORPUS_CHARS
    return path


def bad_corpora(tmp_path: Path) -> list[tuple[str, str]]:
    """(a --quality_corpora value, what its error says) for each kind of corpus the comparison cannot cut."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "records.jsonl").write_text(json.dumps({"text": TEXT}) + "\n")
    (tmp_path / "short.txt").write_text("too short\n" * 20)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes(TEXT.encode() + "café".encode("latin-1"))
    return [(str(tmp_path / "missing.txt"), "missing.txt does not exist; give builtin:NAME or a UTF-8 .txt file"),
            (str(tmp_path / "folder"), "folder is a folder; the comparison cuts its own training and validation"),
            (str(tmp_path / "records.jsonl"), "records.jsonl holds records (.jsonl); the comparison reads plain text"),
            (str(tmp_path / "short.txt"), f"short.txt has 200 characters; the comparison needs at least "
                                          f"{MIN_CORPUS_CHARS:,}"),
            (str(tmp_path / "empty.txt"), "empty.txt has 0 characters"),
            (str(tmp_path / "latin1.txt"), "latin1.txt is not UTF-8 text (byte"),
            ("builtin:numbers-en-fr", "builtin:numbers-en-fr is a translation corpus"),
            ("builtin:nosuch", "unknown built-in corpus 'builtin:nosuch'")]


def test_every_corpus_the_comparison_cannot_cut_is_refused_before_work(tmp_path, corpus):
    for name, message in bad_corpora(tmp_path):
        settings = QualitySettings(corpora=(str(corpus), name))  # the good one first: checked all the same
        with pytest.raises((ValueError, FileNotFoundError)) as refused:
            settings.check()
        assert message in str(refused.value) and "\n" not in str(refused.value), (name, str(refused.value))
    with pytest.raises(ValueError, match=f"names {corpus} more than once; give each corpus once"):
        QualitySettings(corpora=(str(corpus), "builtin:pydocs", str(corpus))).check()
    with pytest.raises(ValueError, match="more than once"):  # one file under two names
        QualitySettings(corpora=(str(corpus), str(corpus.parent / "." / corpus.name))).check()
    QualitySettings(corpora=(str(corpus), "builtin:pydocs")).check()


@pytest.mark.parametrize("extra", ["--max_minutes 5", "--num_threads=7", "--max_steps 10", "--output_dir x",
                                   "--dataset builtin:kjv --optimizer adamw", "--max-minutes 5", "--output-dir x"])
def test_our_arguments_may_change_the_recipe_not_the_comparison(extra):
    with pytest.raises(ValueError, match="--quality_ours_args may not set --[a-z_]+.*the comparison sets them"):
        QualitySettings(ours_args=extra).check()
    with pytest.raises(ValueError, match="unrecognized arguments: --max_min 5"):  # no prefixes: minitx takes none
        QualitySettings(ours_args="--max_min 5").check()
    QualitySettings(ours_args="--optimizer adamw --block_size 64").check()  # the recipe, and both sides' blocks


def test_an_explicit_zero_budget_is_refused_not_replaced_by_the_default(tmp_path):
    with pytest.raises(ValueError, match="--quality_seconds must be a finite number > 0, got 0.0"):
        run.main(["--quality_only", "--quality_seconds", "0"])


def test_the_plot_and_the_json_are_checked_before_work_and_made_in_new_folders(tmp_path, monkeypatch, corpus):
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"a picture of mine")
    for argv, message in (([str(mine)], "--quality_plot .*mine.png exists and was not written by minitx"),
                          ([str(tmp_path / "curves.jpg")], "--quality_plot must be a .png file, got"),
                          ([str(tmp_path / "a.png"), "--json", str(tmp_path / "a.png")],
                           "--json and --quality_plot both name")):
        with pytest.raises((ValueError, FileExistsError), match=message):
            run.main(["--quality_only", "--quality_corpora", str(corpus), "--quality_plot", *argv])
    assert mine.read_bytes() == b"a picture of mine"
    side = {"bits_per_byte": 2.0, "steps": 10, "tokens_per_second": 1.0,
            "curve": [{"seconds": 1.0, "bits_per_byte": 3.0}, {"seconds": 2.0, "bits_per_byte": 2.0}]}
    monkeypatch.setattr(run, "run_quality", lambda settings, log, work: {
        "settings": {"seconds": 30}, "corpora": {str(corpus): {"ours": side, "reference": side, "ratio": 1.0}}})
    plot, data = tmp_path / "new" / "curves.png", tmp_path / "also-new" / "result.json"
    result = run.main(["--quality_only", "--quality_corpora", str(corpus), "--quality_seconds", "30",
                       "--quality_plot", str(plot), "--json", str(data)])
    with Image.open(plot) as image:
        assert image.info.get("Software") == "hf_minitx"  # ours: the next run may replace it
    assert json.loads(data.read_text())["quality"]["plot"] == str(plot) == result["quality"]["plot"]
    assert result["machine"]["torch_threads"] == QualitySettings().num_threads  # the threads the sides ran on
    run.main(["--quality_only", "--quality_corpora", str(corpus), "--quality_seconds", "30", "--quality_plot",
              str(plot)])  # its own picture is replaced without --overwrite


def test_a_work_folder_is_new_empty_or_a_comparison_of_the_same_settings(tmp_path, corpus):
    settings = QualitySettings(seconds=30, corpora=(str(corpus),))
    work = tmp_path / "work"
    claim_work_dir(work, settings)
    assert json.loads((work / SETTINGS_FILE).read_text())["seconds"] == 30
    check_work_dir(work, settings)
    with pytest.raises(ValueError, match=r"holds a comparison of other settings \(seconds\); give the same"):
        check_work_dir(work, QualitySettings(seconds=60, corpora=(str(corpus),)))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty and holds no quality comparison"):
        check_work_dir(tmp_path / "mine", settings)
    with pytest.raises(NotADirectoryError, match="corpus.txt is a file, not a folder; choose another"):
        check_work_dir(corpus, settings)
    with pytest.raises(NotADirectoryError, match="corpus.txt is a file, not a folder; choose another"):
        check_work_dir(corpus / "work", settings)
    assert (tmp_path / "mine").exists() and sorted(p.name for p in work.iterdir()) == [SETTINGS_FILE]


def test_sides_kept_by_an_interrupted_comparison_are_not_measured_again(tmp_path, monkeypatch, corpus):
    settings = QualitySettings(seconds=30, corpora=(str(corpus),), threads=1)
    work = tmp_path / "work"

    def measured(*args, **kwargs):
        raise AssertionError("a kept side was measured again")

    real_run = subprocess.run

    def stand_in(command, **kwargs):  # the shared tokenizer is made; the reference is interrupted
        if "train-tokenizer" in command:
            folder = Path(command[command.index("--output_dir") + 1])
            folder.mkdir(parents=True)
            (folder / "tokenizer.json").write_text("{}")
            return real_run(["true"])
        raise AssertionError(command)

    monkeypatch.setattr(quality.subprocess, "run", stand_in)
    monkeypatch.setattr(quality, "run_ours", lambda *args: {"train_seconds": 30.0})
    monkeypatch.setattr(quality, "score_ours", lambda *args: {"bits_per_byte": 1.5, "steps": 7})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(quality.multiprocessing, "get_context", interrupted)
    with pytest.raises(Interrupted, match=f"the sides measured so far are kept in {work}: the same command"):
        run.measure_quality(settings, str(work), log=lambda _: None)
    assert json.loads((work / "corpus0" / "ours.json").read_text())["bits_per_byte"] == 1.5
    (work / "corpus0" / "reference.json").write_text(json.dumps({"bits_per_byte": 2.0, "steps": 9}))
    monkeypatch.setattr(quality, "run_ours", measured)
    logs: list[str] = []
    result = run_quality(settings, log=logs.append, work=work)["corpora"][str(corpus)]
    assert result["ratio"] == 0.75 and logs == [f"[quality] {corpus}: {side}, measured by the interrupted "
                                                "comparison, kept" for side in ("ours", "reference")]
    corpus.write_text(TEXT + "an edit\n")
    with pytest.raises(ValueError, match="changed since the interrupted comparison"):
        run_quality(settings, log=logs.append, work=work)
    with pytest.raises(Interrupted, match="are lost: give --quality_work_dir DIR to keep them"):
        monkeypatch.setattr(run, "run_quality", interrupted)
        run.measure_quality(settings, None, log=lambda _: None)


def test_a_side_that_fails_is_one_line_with_what_to_change():
    ran_out = ("error: --max_minutes 0.25 (15.0 s) ran out after 13 step(s) of about 0.90 s, inside the timing "
               "probe that makes the plan (the 20 steps after a start or a resume): the schedule never decayed, so "
               "no model is saved as the run's result; /tmp/x/checkpoint-13 holds them: resume it with "
               "--resume_from_checkpoint latest --max_minutes 0.71 (the probe and as many steps again), or train a "
               "number of steps with --max_steps")
    said = child_error("our side's `minitx train`", subprocess.CompletedProcess([], 2, "log\n", ran_out + "\n"))
    assert said == ("our side's `minitx train` failed (exit 2): --max_minutes 0.25 (15.0 s) ran out after 13 step(s) "
                    "of about 0.90 s, inside the timing probe that makes the plan (the 20 steps after a start or a "
                    "resume): the schedule never "
                    "decayed, so no model is saved as the run's result; give --quality_seconds 43 or more")
    crash = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: boom\n"
    assert child_error("it", subprocess.CompletedProcess([], 1, "", crash)) == (
        'it failed (exit 1): Traceback (most recent call last): | File "x.py", line 1 | RuntimeError: boom')


def test_a_run_in_two_phases_counts_the_steps_of_both_in_the_main_table():
    side = {"bits_per_byte": 2.0, "steps": 10, "tokens_per_second": 1100.0}
    ours = {**side, "steps": 15, "phases": {"steps": {"teacher": 20, "student": 15}}}
    table = format_quality({"settings": {"seconds": 60}, "corpora": {"c": {"reference": side, "ours": ours,
                                                                          "ratio": 1.0}}})
    assert "| `c` | 60 | 2.000 | 10 | 1,100 | 2.000 | 20 + 15 | 1,100 | 1.000x |" in table
