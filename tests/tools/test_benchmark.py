"""The benchmark's correctness in a tiny mode: every workload reported, figures sane, ratios consistent.

No timing assertions: speed is only ever judged by running scripts/benchmark.py itself.
"""

import json
import math
import re
import statistics
from pathlib import Path

import pytest
import torch

import hf_minitx
from hf_minitx.tools.benchmark import run
from hf_minitx.tools.benchmark.generation import int8_available
from hf_minitx.tools.benchmark.memory import MEMORY_IMPLEMENTATIONS, PACKAGE_ROOT
from hf_minitx.tools.benchmark.models import BenchmarkShape, build, count_parameters
from hf_minitx.tools.benchmark.speed import WORKLOADS, format_table, interleaved, run_workload, summarize

TINY = ["--vocab-size", "64", "--context", "16", "--layers", "2", "--hidden", "32", "--heads", "2",
        "--batch", "2", "--seq2seq-len", "8", "--prompt-len", "4", "--new-tokens", "6", "--rounds", "2",
        "--warmup", "0", "--no-data-prep", "--no-quality",
        "--compile-backend", "eager"]  # the compiled rows, without inductor's wait


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One full tiny run through the command-line entry point, memory subprocesses included."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    returned = run.main(TINY + ["--json", str(out)])
    return returned, json.loads(out.read_text())


@pytest.mark.slow
def test_json_has_every_workload_and_implementation(tiny_run):
    _, result = tiny_run
    assert set(result["workloads"]) == set(WORKLOADS)
    for workload, (reference, names) in WORKLOADS.items():
        data = result["workloads"][workload]
        assert data["reference"] == reference
        int8 = set() if int8_available() else {"minitx-int8", "minitx-int8-compiled"}  # torchao: an opt-in extra
        assert set(data["implementations"]) == set(names) - int8
        assert all(len(v) == 2 for v in data["raw_tokens_per_second"].values())
    assert set(result["memory"]) == set(MEMORY_IMPLEMENTATIONS)
    assert "skipped" in result["mfu"]  # CPU run: MFU is CUDA-only
    machine = result["machine"]
    for key in ("cpu", "load_average", "load_average_end", "torch", "transformers", "hf_minitx", "torch_threads"):
        assert key in machine
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", machine["date"])
    assert machine["torch_threads"] == 1
    assert result["shape"]["hidden"] == 32 and result["shape"]["new_tokens"] == 6


@pytest.mark.slow
def test_figures_positive_finite_and_ratios_match_raw(tiny_run):
    _, result = tiny_run
    for data in result["workloads"].values():
        raw = data["raw_tokens_per_second"]
        ref = raw[data["reference"]]
        for name, figures in data["implementations"].items():
            rate = figures["tokens_per_second"]
            assert math.isfinite(rate) and rate > 0
            assert rate == pytest.approx(statistics.median(raw[name]))
            paired = statistics.median(a / b for a, b in zip(raw[name], ref, strict=True))
            assert figures["ratio_vs_reference"] == pytest.approx(paired)
        assert data["implementations"][data["reference"]]["ratio_vs_reference"] == pytest.approx(1.0)
    b1 = result["workloads"]["generate_b1"]["raw_tokens_per_second"]
    speedup = statistics.median(a / b for a, b in zip(b1["minitx"], b1["minitx-no-cache"], strict=True))
    assert result["workloads"]["generate_b1"]["minitx_cache_speedup"] == pytest.approx(speedup)
    speedup = statistics.median(a / b for a, b in zip(b1["gpt2"], b1["gpt2-no-cache"], strict=True))
    assert result["workloads"]["generate_b1"]["gpt2_cache_speedup"] == pytest.approx(speedup)
    for mem in result["memory"].values():
        assert mem["peak_bytes"] > 0 and mem["growth_bytes"] >= 0
    for workload in ("generate_b1", "generate_b8"):
        data = result["workloads"][workload]
        raw = data["raw_tokens_per_second"]
        assert data["compile_backend"] == "eager"
        for who in ("minitx", "gpt2"):
            assert data["compile_seconds"][f"{who}-compiled"] >= 0  # measured apart, not in the tokens/s
            speedup = statistics.median(c / e for c, e in zip(raw[f"{who}-compiled"], raw[who], strict=True))
            assert data[f"{who}_compiled_speedup"] == pytest.approx(speedup)
    assert "compile_seconds" not in result["workloads"]["generate_seq2seq"]
    for workload in ("generate_b1", "generate_b8"):  # low precision over our own fp32, round by round
        data = result["workloads"][workload]
        raw = data["raw_tokens_per_second"]
        for low in ("minitx-bf16", "minitx-int8", "minitx-int8-compiled")[:1 + 2 * int8_available()]:
            ratio = statistics.median(x / f for x, f in zip(raw[low], raw["minitx"], strict=True))
            assert data[f"{low}_vs_fp32"] == pytest.approx(ratio)
            assert f"| {workload} | {low} vs minitx fp32 | | {ratio:.2f}x |" in format_table(result)
        if int8_available():  # compiled over compiled too
            ratio = statistics.median(x / f for x, f in zip(raw["minitx-int8-compiled"], raw["minitx-compiled"],
                                                            strict=True))
            assert data["minitx-int8-compiled_vs_fp32_compiled"] == pytest.approx(ratio)


def test_the_bf16_row_generates_with_bf16_weights():
    from hf_minitx.tools.benchmark.generation import generation_step, lower_precision

    shape = BenchmarkShape(vocab_size=64, context=16, layers=2, hidden=32, heads=2, batch=2, seq2seq_len=8,
                           prompt_len=4, new_tokens=5)
    model = lower_precision(build("minitx", shape), "minitx-bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert lower_precision(build("minitx", shape), "minitx").dtype == torch.float32
    step, compile_seconds = generation_step("minitx-bf16", shape, batch=2)
    assert step() == 2 * 5 and compile_seconds is None


def test_compiled_generation_rows_are_left_out_with_backend_none():
    shape = BenchmarkShape(vocab_size=64, context=16, layers=2, hidden=32, heads=2, batch=2, seq2seq_len=8,
                           prompt_len=4, new_tokens=3)
    result = run_workload("generate_b8", shape, rounds=1, repeats=1, warmup=0, compile_backend="none")
    assert not any(name.endswith("-compiled") for name in result["implementations"])
    assert {"gpt2", "minitx", "minitx-bf16"} <= set(result["implementations"])
    assert "compile_seconds" not in result and "minitx_compiled_speedup" not in result


def test_seq2seq_generation_step_makes_exactly_the_new_tokens():
    from hf_minitx.tools.benchmark.generation import generation_step

    shape = BenchmarkShape(vocab_size=64, context=16, layers=2, hidden=32, heads=2, batch=2, seq2seq_len=8,
                           prompt_len=4, new_tokens=5)
    for name in ("bart", "minitx-seq2seq"):
        step, compile_seconds = generation_step(name, shape, batch=3)
        assert step() == 3 * 5 and compile_seconds is None


@pytest.mark.slow
def test_same_parameter_count_as_the_references(tiny_run):
    _, result = tiny_run
    params = result["workloads"]["train_causal"]["parameters"]
    # GPT-2 and hf_minitx configured alike: learned positions, biases, tied embeddings, pre-LN.
    assert params["minitx-sdpa"] == params["gpt2"] == params["minitx-eager"] == params["gpt2-gelu"]
    s2s = result["workloads"]["train_seq2seq"]["parameters"]
    # BART adds one embedding LayerNorm per stack (2 * 2 * hidden parameters) and offsets positions by 2.
    assert abs(s2s["minitx-seq2seq"] - s2s["bart"]) <= 4 * 32 + 2 * 2 * 32


def test_summarize_takes_medians_and_paired_ratios():
    rates = {"ref": [100.0, 50.0, 80.0], "fast": [150.0, 100.0, 80.0]}
    out = summarize(rates, "ref")
    assert out["fast"]["tokens_per_second"] == 100.0
    assert out["fast"]["ratio_vs_reference"] == 1.5  # per-round ratios 1.5, 2.0, 1.0
    assert out["ref"]["ratio_vs_reference"] == 1.0


def test_interleaving_rotates_the_order():
    calls = []
    steps = {name: (lambda name=name: calls.append(name) or 1) for name in "abc"}
    interleaved(steps, rounds=3, repeats=1, warmup=0)
    assert calls == list("abc" "bca" "cab")


def test_memory_probes_import_the_package_they_are_part_of():
    # each probe runs in a fresh interpreter, with the folder that holds hf_minitx first on its path
    assert (Path(PACKAGE_ROOT) / "hf_minitx" / "__init__.py").samefile(Path(hf_minitx.__file__))


def test_bad_shape_is_rejected_before_work():
    with pytest.raises(ValueError, match="divisible by heads"):
        BenchmarkShape(hidden=30, heads=4).check()
    with pytest.raises(ValueError, match="positive integer"):
        BenchmarkShape(batch=0).check()
    with pytest.raises(ValueError, match="divisible by heads"):
        run.main(["--hidden", "30", "--heads", "4", "--no-memory"])
    with pytest.raises(ValueError, match="Unknown implementation"):
        build("gpt3", BenchmarkShape())


def test_minitx_matches_gpt2_parameter_count_at_default_shape():
    shape = BenchmarkShape(vocab_size=512, context=32, hidden=64, heads=4, layers=2)
    assert count_parameters(build("minitx-sdpa", shape)) == count_parameters(build("gpt2", shape))


@pytest.mark.slow
def test_data_preparation_section_compares_every_recipe_on_the_same_text():
    from hf_minitx.tools.benchmark.data_prep import BASELINES, SIDES, format_data_prep, run_data_prep

    result = run_data_prep(megabytes=0.3, vocab_size=30_000, block_size=32, log=lambda _: None)
    assert set(result["sides"]) == set(SIDES) and 0.3e6 <= result["text_bytes"] < 0.36e6  # the size asked
    assert 260 < result["vocab_size"] < 30_000  # the tokenizer used: this text holds fewer merges than asked
    for figures in result["sides"].values():
        assert figures["seconds"] > 0 and figures["cpu_seconds"] > 0 and figures["rows"] > 0
        assert figures["text_mb_per_second"] == pytest.approx(result["text_bytes"] / 1e6 / figures["seconds"])
        assert 0 < figures["cache_bytes_per_text_byte"] < 100
    ours = result["sides"]["minitx"]
    # the same text in blocks: run_clm loses each map batch's remainder and, by paragraphs, the blank lines
    for side in BASELINES:
        assert 0.9 * ours["tokens"] < result["sides"][side]["tokens"] <= ours["tokens"]
        # the baselines keep the text's arrow copy, int32/int64 ids and stored labels
        assert result["sides"][side]["cache_bytes_per_text_byte"] > 2
    # we keep one copy of uint16 ids (and arrow headers), no copy of the text
    assert ours["cache_bytes_per_text_byte"] * result["text_bytes"] < 2 * ours["tokens"] + 8192
    assert result["speedup_vs_stronger_baseline"] == pytest.approx(min(result["speedup_vs"].values()))
    table = format_data_prep(result)
    assert "a row per paragraph" in table and "faster baseline" in table


def test_data_preparation_alone_and_its_settings_are_checked_first():
    with pytest.raises(ValueError, match="--data_prep_only contradicts"):
        run.main(["--data_prep_only", "--no_data_prep"])
    with pytest.raises(ValueError, match="--data_prep_block_size must be >= 2"):
        run.main(["--data_prep_only", "--data_prep_block_size", "1"])
    for megabytes in ("nan", "-1", "0"):  # NaN reached int(), -1 a traceback about empty files
        with pytest.raises(ValueError, match=f"--data_prep_mb must be a number of megabytes > 0, got {megabytes}"):
            run.main(["--data_prep_only", "--data_prep_mb", megabytes])


@pytest.mark.parametrize("argv,message", [
    (["--rounds", "0"], "--rounds must be >= 1"), (["--device", "tpu"], "unknown device 'tpu'"),
    (["--device", "meta"], "runs on cpu or cuda"),
])
def test_bad_benchmark_options_are_refused_before_work(argv, message):
    with pytest.raises(ValueError, match=message):
        run.main(["--quick", "--no_memory", "--no_data_prep", "--no_quality", *argv])
