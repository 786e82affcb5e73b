"""The model card: its metadata, its body, and the training recipe and figures it records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import saved_model
from huggingface_hub import metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results
from saved_model import (
    CAUSAL_METRICS,
    SENTENCES,
    SEQ2SEQ_METRICS,
    card_metadata,
    write_records,
)

from hf_minitx import MiniTxForCausalLM, MiniTxForConditionalGeneration
from hf_minitx.data.tokenizer import load_tokenizer
from hf_minitx.hub.folder import ModelFolderError
from hf_minitx.hub.push import (
    check_model_card,
    render_model_card,
    write_model_card,
)

folders, causal_copy = saved_model.folders, saved_model.causal_copy  # the fixtures of saved models


@pytest.mark.parametrize("kind", ["causal-lm", "seq2seq"])
def test_card_metadata_carries_task_tags_and_measured_metrics(folders, kind):
    text = render_model_card(folders[kind], repo_id="alice/tiny")
    check_model_card(text)
    data = card_metadata(text)
    assert data["library_name"] == "transformers"
    assert data["pipeline_tag"] == {"causal-lm": "text-generation", "seq2seq": "text2text-generation"}[kind]
    assert data["tags"] == ["hf_minitx", "custom_code", kind]
    assert data["license"] == "apache-2.0"
    assert "datasets" not in data  # built-in corpora are not Hub datasets
    name, results = model_index_to_eval_results(data["model-index"])
    assert name == "tiny"
    expected = CAUSAL_METRICS if kind == "causal-lm" else SEQ2SEQ_METRICS
    reported = {r.metric_type: r.metric_value for r in results}
    assert reported == {key.removeprefix("eval_"): value for key, value in expected.items()}
    assert {r.dataset_split for r in results} == {"validation"}


def test_card_body_shows_architecture_parameters_training_and_usage(folders):
    folder = folders["seq2seq"]
    text = render_model_card(folder, repo_id="alice/numbers")
    model = MiniTxForConditionalGeneration.from_pretrained(folder)
    assert f"| Parameters | {model.num_parameters():,} " in text
    assert "| Layers | 2 encoder + 2 decoder |" in text
    assert "rotary (RoPE)" in text and "pre-LayerNorm" in text
    assert "| Optimizer steps | 120 |" in text and "| Training tokens | 245,760" in text
    assert "| Training time | 1 min 16 s |" in text and "1 x cpu (2 cores)" in text
    assert "| Validation exact match (%) | 99.25 |" in text and "| Validation BLEU (sacreBLEU) | 98.76 |" in text
    assert 'AutoModelForSeq2SeqLM.from_pretrained("alice/numbers", trust_remote_code=True)' in text
    assert 'AutoModelForSeq2SeqLM.from_pretrained("alice/numbers")\n' in text  # installed-package path
    assert "byte-level BPE tokenizer with 300 tokens" in text
    assert "| `seven hundred and twelve` | `and the 'earth' was` |" in text  # newline/backticks cannot break it


def test_card_code_examples_use_the_recorded_prompt_and_its_table_a_safe_copy(causal_copy):
    summary = json.loads((causal_copy / "training_summary.json").read_text())
    summary["sample_generations"] = [{"prompt": '| | as "s[len(s):]" = `t`', "output": "ok"}]
    (causal_copy / "training_summary.json").write_text(json.dumps(summary))
    text = render_model_card(causal_copy)
    assert 'tokenizer(["| | as \\"s[len(s):]\\" = `t`"], return_tensors="pt")' in text  # the prompt as given
    assert "| `/ / as \"s[len(s):]\" = 't'` | `ok` |" in text  # a table cell cannot be split by it
    summary["sample_generations"] = [{"prompt": "```\nrm", "output": "ok"}]  # it would end the code block
    (causal_copy / "training_summary.json").write_text(json.dumps(summary))
    assert 'tokenizer(["In the beginning"], return_tensors="pt")' in render_model_card(causal_copy)


def test_card_names_the_config_overrides_a_run_was_given(causal_copy):
    assert "Config overrides" not in render_model_card(causal_copy)
    summary = json.loads((causal_copy / "training_summary.json").read_text())
    (causal_copy / "training_summary.json").write_text(json.dumps({**summary, "config_overrides": "hidden_size=96"}))
    assert "| Config overrides | `hidden_size=96` |" in render_model_card(causal_copy)


def test_card_lists_hub_datasets_only(folders, tmp_path):
    folder = Path(shutil.copytree(folders["causal-lm"], tmp_path / "m"))
    write_records(folder, "causal-lm", CAUSAL_METRICS, dataset="someone/poems", dataset_config="small",
                   hub_dataset=True)
    data = card_metadata(render_model_card(folder))
    assert data["datasets"] == ["someone/poems"]
    _, results = model_index_to_eval_results(data["model-index"])
    assert {(r.dataset_type, r.dataset_config) for r in results} == {("someone/poems", "small")}


def test_card_without_training_summary_has_no_model_index(causal_copy):
    (causal_copy / "training_summary.json").unlink()
    text = render_model_card(causal_copy)
    check_model_card(text)
    assert "model-index" not in card_metadata(text)
    assert "No validation metrics were recorded" in text
    assert "your-username/model" in text  # usage snippet falls back to the folder name


def test_card_drops_non_finite_metrics(causal_copy):
    write_records(causal_copy, "causal-lm", {"eval_loss": float("nan"), "eval_perplexity": 12.5})
    _, results = model_index_to_eval_results(card_metadata(render_model_card(causal_copy))["model-index"])
    assert [(r.metric_type, r.metric_value) for r in results] == [("perplexity", 12.5)]


def test_card_rejects_summary_of_the_other_task(causal_copy):
    write_records(causal_copy, "seq2seq", SEQ2SEQ_METRICS)
    with pytest.raises(ModelFolderError, match="training_summary.json says task='seq2seq'"):
        render_model_card(causal_copy)


def test_write_model_card_round_trips_through_metadata_load(causal_copy):
    path = write_model_card(causal_copy)
    assert path == causal_copy / "README.md"
    assert metadata_load(path) == card_metadata(path.read_text())
    assert metadata_load(path)["pipeline_tag"] == "text-generation"


def test_check_model_card_rejects_bad_metadata(folders):
    good = render_model_card(folders["causal-lm"])
    with pytest.raises(ValueError, match="library_name"):
        check_model_card(good.replace("library_name: transformers", "library_name: timm"))
    with pytest.raises(ValueError, match="tags lack"):
        check_model_card(good.replace("- custom_code\n", ""))
    with pytest.raises(ValueError, match="non-numeric"):
        check_model_card(good.replace("value: 24.99", "value: lots"))
    with pytest.raises(ValueError, match="model_index"):  # huggingface_hub's own parser refuses it
        check_model_card(good.replace("    dataset:\n", "    dataset_gone:\n", 1))


CLEAN_LOAD = """
import json, sys
sys.modules["hf_minitx"] = None  # an environment without hf_minitx
from transformers import AutoTokenizer, PreTrainedTokenizerFast
model_dir, tokenizer_dir, text = sys.argv[1:]
loaded = [AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True),
          PreTrainedTokenizerFast.from_pretrained(model_dir), AutoTokenizer.from_pretrained(tokenizer_dir)]
print(json.dumps([tokenizer(text)["input_ids"] for tokenizer in loaded]))
"""


def test_tokenizer_loads_in_a_clean_environment_as_the_card_says(causal_copy, tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    load_tokenizer(causal_copy).save_pretrained(tokenizer_dir)  # loaded and saved again, as --tokenizer does
    load_tokenizer(tokenizer_dir).save_pretrained(causal_copy)
    for folder in (tokenizer_dir, causal_copy):
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        assert not {"is_local", "local_files_only"} & set(settings), settings
    text = SENTENCES[0]
    done = subprocess.run([sys.executable, "-c", CLEAN_LOAD, str(causal_copy), str(tokenizer_dir), text],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "warning"})
    assert done.returncode == 0, done.stderr
    assert "Do you wish" not in done.stdout + done.stderr and done.stderr.strip() == "", done.stderr
    expected = load_tokenizer(causal_copy)(text)["input_ids"]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [expected] * 3
    card = render_model_card(causal_copy)
    assert "AutoTokenizer.from_pretrained(repo, trust_remote_code=True)" in card
    assert "PreTrainedTokenizerFast.from_pretrained(repo)" in card and "loads it without custom code" not in card


def test_card_records_the_training_recipe(causal_copy):
    from hf_minitx.training.arguments import TrainArguments
    from hf_minitx.training.optim import build_optimizer, describe_optimizer, describe_schedule

    model = MiniTxForCausalLM.from_pretrained(causal_copy)
    args = TrainArguments(optimizer="muon", lr_scheduler_type="warmup_stable_decay", warmup_steps=10,
                          decay_ratio=0.2, muon_learning_rate=0.03)
    recipe = {"optimizer": "muon", "schedule": describe_schedule(args, 120), "global_batch_size": 32,
              "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2, "block_size": 128,
              "max_grad_norm": 1.0, "parameter_groups": describe_optimizer(build_optimizer(model, args))}
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS, recipe=recipe)
    text = render_model_card(causal_copy, repo_id="alice/tiny")
    muon = recipe["parameter_groups"][0]
    assert "| Optimizer | `muon` |" in text
    assert (f"| Group `muon` | Muon, peak lr 0.03, weight decay {args.muon_weight_decay:g}, "
            f"momentum {args.muon_momentum:g}, "
            f"{muon['tensors']} tensors, {muon['parameters']:,} parameters |") in text
    assert (f"| Group `adamw_no_decay` | AdamW, peak lr {args.learning_rate:g}, weight decay 0, "
            f"betas ({args.adam_beta1:g}, {args.adam_beta2:g}),") in text
    assert ("| Schedule | `warmup_stable_decay`, 10 warmup steps, 120 steps, linear decay over the last 24 to 0 x "
            "peak |") in text
    assert "| Batch | 32 rows per optimizer step (16 per process x 2 accumulation) |" in text
    assert "| Block size | 128 tokens |" in text and "| Gradient clipping | 1 |" in text
    # a warmup longer than the run, then a resume that laid the schedule over more steps
    long_warmup = TrainArguments(lr_scheduler_type="cosine", warmup_steps=50)
    recipe["schedule"] = {**describe_schedule(long_warmup, 5),
                          "schedule_changes": [{"step": 4, "total_steps_before": 5, "total_steps": 8}]}
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS, recipe=recipe)
    assert ("| Schedule | `cosine`, 50 warmup steps, 5 steps (the warmup outlasted the run: the peak rate was never "
            "reached); from step 4 laid over 8 steps instead of 5 (a resume) |") in render_model_card(causal_copy)
    # late dropout: planned from a pass the 120 steps reached, then from one they did not
    recipe["late_dropout"] = {"probability": 0.1, "from_step": 100, "after_passes": 2.0}
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS, recipe=recipe)
    assert ("| Late dropout | 0.1 on the embeddings and sub-layer outputs from step 100, after 2 passes over the "
            "training data |") in render_model_card(causal_copy)
    recipe["late_dropout"]["from_step"] = 130
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS, recipe=recipe)
    assert ("| Late dropout | none: the run ended before step 130, where 0.1 would have started |"
            in render_model_card(causal_copy))


def test_the_card_of_a_run_that_ended_at_chance_carries_its_warning(causal_copy):
    warning = ("warning: the final evaluation is far worse than chance (perplexity 1.014e+304 with a 4096-token "
               "vocabulary): the training diverged and the model is unusable. Start again with a lower --learning_rate")
    diverged = {"eval_loss": 700.02, "eval_perplexity": 1.0142320547350045e304, "eval_bits_per_byte": 281.6}
    write_records(causal_copy, "causal-lm", diverged, warning=warning)
    card = render_model_card(causal_copy)
    assert f"> **Warning:** {warning.removeprefix('warning: ')}" in card
    assert "| Validation perplexity | 1.014e+304 |" in card
    assert "| Validation loss (nats per token) | 700.0200 |" in card
    assert card.index("> **Warning:**") < card.index("| Metric | Value |")
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS)
    assert "Warning" not in render_model_card(causal_copy)


def test_card_says_what_temperature_was_folded_into_the_weights(causal_copy):
    fitted = {"temperature": 1.0949, "logit_scale": 0.91331, "fitted_on_tokens": 16256, "fitted_loss_before": 3.32147,
              "fitted_loss_after": 3.30100}
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS, calibration=fitted)
    assert ("| Temperature | the logits divided by 1.0949, folded into the final norm: fitted on 16,256 validation "
            "tokens, loss 3.3215 → 3.3010 |") in render_model_card(causal_copy)
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS, calibration={**fitted, "logit_scale": 1.0})
    assert "| Temperature |" not in render_model_card(causal_copy)  # fitted, but not worth folding in


def test_the_budget_row_says_whether_a_probe_timed_the_plan_and_the_rate_is_the_recorded_one():
    from hf_minitx.hub.card_training import training_rows

    budget = {"budget_minutes": 0.3, "planned_steps": 290, "probe_steps": 20, "steps_run": 290, "ended_by": "plan",
              "seconds_per_step": 0.06}
    summary = {"time_budget": budget, "steps": 290, "tokens_seen": 5999, "train_seconds": 18.0,
               "tokens_per_second": 333.4}
    rows = dict(training_rows(summary))
    assert rows["Time budget"] == "0.3 min: 290 steps planned after a 20-step timed probe; 290 ran (the plan ran to " \
                                  "its end)"
    assert rows["Throughput"] == "333.4 tokens/s"  # the summary's figure, not one from the rounded seconds
    short = {**budget, "planned_steps": 10, "steps_run": 10, "seconds_per_step": None}  # --max_steps 10: no probe
    assert dict(training_rows({**summary, "time_budget": short}))["Time budget"] == (
        "0.3 min: 10 steps planned without a timed probe (no more than its 20 steps were asked); 10 ran (the plan "
        "ran to its end)")

