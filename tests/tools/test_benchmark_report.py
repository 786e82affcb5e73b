"""`minitx benchmark-report`: the benchmark results page's tables and the README's headline come from benchmark
JSON, and the committed ones are exactly what the committed JSON renders to (so they cannot drift)."""

import json
from pathlib import Path

import pytest

from hf_minitx.tools.benchmark import report
from hf_minitx.tools.benchmark.report import (
    HEADLINE_BLOCK,
    PAGE_BLOCK,
    describe_run,
    read_result,
    read_results,
    render_headline,
    render_page,
    render_pages,
    replace_block,
)
from hf_minitx.tools.benchmark.speed import summarize

ROOT = Path(__file__).resolve().parents[2]
COMMITTED_RESULTS = ROOT / "docs" / "benchmark"


def results(quality: bool = True) -> dict:
    """A small result in the shape `minitx benchmark --json` writes (implementations through `summarize`)."""
    train = {"gpt2": [100.0, 110.0], "minitx-sdpa": [130.0, 121.0]}
    generate = {"gpt2": [50.0, 40.0], "minitx": [60.0, 60.0]}
    result = {
        "machine": {"cpu": "Test CPU 9000", "cpu_count": 2, "load_average": [0.25, 0.5, 0.5], "torch_threads": 1,
                    "device": "cpu", "python": "3.11.7", "torch": "2.13.0", "transformers": "5.24.0",
                    "hf_minitx": "0.1.0", "platform": "Linux", "date": "2026-11-25 18:00 UTC",
                    "load_average_end": [1.75, 1.0, 0.5]},
        "shape": {"vocab_size": 64, "context": 16, "layers": 2, "hidden": 32, "heads": 2, "ffn_mult": 4, "batch": 2,
                  "seq2seq_len": 8, "prompt_len": 4, "new_tokens": 6},
        "settings": {"rounds": 2, "repeats": 1, "warmup": 0},
        "workloads": {
            "train_causal": {"reference": "gpt2", "implementations": summarize(train, "gpt2"),
                             "raw_tokens_per_second": train},
            "generate_b1": {"reference": "gpt2", "implementations": summarize(generate, "gpt2"),
                            "raw_tokens_per_second": generate},
        },
        "command": "minitx benchmark --quick --no_quality",
    }
    if quality:
        side = {"steps": 0, "train_seconds": 30.0, "tokens_seen": 0}
        result["quality"] = {"settings": {"seconds": 30.0, "corpora": ["builtin:kjv"], "threads": 1,
                                          "shared_shape": False, "layers": 4, "hidden": 128},
                             "corpora": {"builtin:kjv": {
                                 "reference": {**side, "bits_per_byte": 2.5, "steps": 40, "tokens_per_second": 4100.0},
                                 "ours": {**side, "bits_per_byte": 2.0, "steps": 61, "tokens_per_second": 5230.0},
                                 "ratio": 0.8, "extra_key": "ignored"}}}
    return result


def table_rows(markdown: str) -> list[str]:
    """The body rows of every table of a Markdown text (header and separator rows left out)."""
    return [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("| measure |")]


def test_the_headline_names_each_figure_its_reference_and_the_run_once_with_its_command_and_machine():
    headline = render_headline(results())
    assert headline.splitlines()[0] == ("`minitx benchmark --quick --no_quality` (Test CPU 9000, 2 cores, device cpu, "
                                        "1 torch thread; 2026-11-25 18:00 UTC):")
    rows = table_rows(headline)
    assert rows[0] == "| quality: bits/byte on `builtin:kjv` after 30 s | 2.000 | GPT-2 2.500 | 0.800x |"
    # medians 125.5 vs 105; the paired ratio is the median of 1.3 and 1.1
    assert rows[1] == "| decoder-only training (tokens/s) | 126 | GPT-2 105 | 1.20x |"
    assert rows[2].startswith("| generation, batch 1 (tokens/s) | 60 | GPT-2 45 | 1.35x |")
    assert len(rows) == 3  # workloads the run left out have no row
    assert headline.count("minitx benchmark --quick") == 1  # one command per group of rows, not per row


def test_a_quality_run_says_which_shape_our_side_trained():
    planned, fixed, older = results(), results(), results()
    fixed["quality"]["settings"]["shared_shape"] = True
    del older["quality"]["settings"]["shared_shape"]  # runs from before the budget planned our shape: fixed
    assert "the shape its budget planned" in render_page(planned) and "both at 4 × 128" not in render_headline(
        planned)
    for result in (fixed, older):
        assert "ours at the reference's 4 × 128" in render_page(result)
        assert table_rows(render_headline(result))[0].startswith("| quality: bits/byte on `builtin:kjv` after 30 s, "
                                                                  "both at 4 × 128 |")


def test_speed_measured_on_a_gpu_names_it_in_the_headline_and_keeps_only_training():
    result = results(quality=False)
    result["machine"].update(device="cuda", gpu="NVIDIA H200")
    rows = table_rows(render_headline(result))
    assert rows == ["| decoder-only training (tokens/s, NVIDIA H200) | 126 | GPT-2 105 | 1.20x |"]
    assert "(NVIDIA H200, 2 cores, device cuda, 1 torch thread; " in render_headline(result)


def test_the_headline_takes_a_speed_row_from_the_run_at_the_largest_shape_and_groups_by_run():
    quick, full, gpu = results(quality=False), results(quality=False), results(quality=False)
    full["shape"].update(hidden=384, layers=6)
    full["command"], gpu["command"] = "minitx benchmark --workloads generate_b1", "minitx benchmark --device cuda"
    full["workloads"].pop("train_causal")
    full["workloads"]["generate_b1"]["implementations"]["minitx"]["tokens_per_second"] = 999.0
    gpu["machine"].update(device="cuda", gpu="NVIDIA H200")
    quality = results()
    quality.pop("workloads")
    quality["command"] = "minitx benchmark --quality_only"
    headline = render_headline([gpu, quality, full, quick])
    lines = [line for line in headline.splitlines() if line.startswith("`")]  # one heading line per run
    assert [line.split("`")[1] for line in lines] == [
        "minitx benchmark --workloads generate_b1", "minitx benchmark --quick --no_quality",
        "minitx benchmark --quality_only", "minitx benchmark --device cuda"]  # CPU speed, quality, then GPUs
    rows = table_rows(headline)
    assert [row.split(" | ")[0] for row in rows] == [
        "| generation, batch 1 (tokens/s)", "| decoder-only training (tokens/s)",
        "| quality: bits/byte on `builtin:kjv` after 30 s", "| decoder-only training (tokens/s, NVIDIA H200)"]
    assert "| generation, batch 1 (tokens/s) | 999 |" in headline  # the larger shape's figure, not the quick one's


def test_the_page_has_a_table_per_section_and_skips_the_quality_section_when_absent():
    page = render_page(results())
    assert page.startswith("Measured by `minitx benchmark --quick --no_quality` on 2026-11-25 18:00 UTC")
    assert "| train_causal | minitx-sdpa | 126 | 1.20x |" in page  # the benchmark's own table
    assert "vocabulary 64, context 16, 2 layers" in page and "medians of 2 rounds" in page
    assert "| `builtin:kjv` | 30 | 2.500 | 40 | 4,100 | 2.000 | 61 | 5,230 | 0.800x |" in page
    without = render_page(results(quality=False))
    assert "### Speed" in without and "Quality" not in without and "builtin:kjv" not in without
    quality_alone = {key: value for key, value in results().items() if key not in ("workloads", "shape")}
    assert "### Speed" not in render_page(quality_alone) and "0.800x" in render_page(quality_alone)


def test_replace_block_rewrites_only_between_its_markers_and_refuses_a_file_without_them():
    text = ("intro\n<!-- minitx benchmark-report: tables begin -->\nold\ntable\n"
            "<!-- minitx benchmark-report: tables end -->\noutro\n")
    new = replace_block(text, "tables", "new table\n")
    assert new == text.replace("old\ntable\n", "new table\n")
    assert replace_block(new, "tables", "new table") == new  # rendering twice changes nothing
    with pytest.raises(ValueError, match="headline begin"):
        replace_block(text, "headline", "x")


def test_the_command_rewrites_the_page_and_the_readme_and_writes_neither_when_one_lacks_markers(tmp_path):
    data = tmp_path / "bench.json"
    data.write_text(json.dumps(results()))
    page, readme = tmp_path / "benchmark-results.md", tmp_path / "README.md"
    page.write_text(f"# Performance\n<!-- minitx benchmark-report: {PAGE_BLOCK} begin -->\n"
                    f"<!-- minitx benchmark-report: {PAGE_BLOCK} end -->\nprose\n")
    readme.write_text("# hf_minitx\nno markers here\n")
    paths = ["--json", str(data), "--results_page", str(page), "--readme", str(readme)]
    before = page.read_text()
    with pytest.raises(ValueError, match="README.md: expected one pair of markers"):
        report.main(paths)
    assert page.read_text() == before
    readme.write_text(f"# hf_minitx\n<!-- minitx benchmark-report: {HEADLINE_BLOCK} begin -->\nstale\n"
                      f"<!-- minitx benchmark-report: {HEADLINE_BLOCK} end -->\n")
    report.main(paths)
    assert render_page(results()) in page.read_text() and page.read_text().endswith("\nprose\n")
    assert render_headline(results()) in readme.read_text() and "stale" not in readme.read_text()
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="no benchmark results"):
        read_result(tmp_path / "list.json")


@pytest.mark.parametrize("edit", [{"machine": "x"}, {"machine": {}}, {"shape": None}, {"workloads": None}])
def test_a_result_edited_by_hand_is_refused_in_one_line_and_nothing_is_written(tmp_path, edit):
    """A field of the wrong kind ended in a traceback, a missing one in `error: cpu`."""
    data = tmp_path / "bench.json"
    data.write_text(json.dumps({**results(), **edit}))
    page, readme = tmp_path / "page.md", tmp_path / "README.md"
    for path, block in ((page, PAGE_BLOCK), (readme, HEADLINE_BLOCK)):
        path.write_text(f"<!-- minitx benchmark-report: {block} begin -->\n"
                        f"<!-- minitx benchmark-report: {block} end -->\n")
    before = page.read_text(), readme.read_text()
    with pytest.raises(ValueError, match="a field is missing or of the wrong kind .*minitx benchmark --json FILE"):
        report.main(["--json", str(data), "--results_page", str(page), "--readme", str(readme)])
    assert (page.read_text(), readme.read_text()) == before
    data.write_text(json.dumps(results()))
    with pytest.raises(IsADirectoryError, match="is a folder; pass the Markdown file"):  # said "no such file"
        report.main(["--json", str(data), "--results_page", str(tmp_path), "--readme", str(readme)])
    with pytest.raises(FileNotFoundError) as missing:  # a page the user named: no "run from the checkout's root"
        report.main(["--json", str(data), "--results_page", str(tmp_path / "res.md"), "--readme", str(readme)])
    assert str(missing.value) == (f"--results_page {tmp_path / 'res.md'}: no such file; pass a Markdown page that "
                                  "exists and holds the markers of the part to rewrite")


def test_a_missing_results_folder_is_not_told_to_be_written_as_a_file(tmp_path, monkeypatch):
    # outside a checkout the default docs/benchmark does not exist: `minitx benchmark --json docs/benchmark` would
    # write one file of that name, not the folder the report reads
    with pytest.raises(FileNotFoundError, match="no such file or folder; run from the checkout's root") as error:
        monkeypatch.chdir(tmp_path)
        report.main([])  # the default, docs/benchmark, from a folder that is no checkout
    assert "--json FILE.json" in str(error.value)
    with pytest.raises(FileNotFoundError, match="no such file or folder; write one with") as error:
        report.main(["--json", str(tmp_path / "results")])
    with pytest.raises(FileNotFoundError, match=r"no such file; write it with `minitx benchmark --json .*run\.json`"):
        report.main(["--json", str(tmp_path / "run.json")])


def test_the_committed_page_and_readme_headline_are_what_the_committed_json_renders():
    results = read_results([COMMITTED_RESULTS])
    assert results, "docs/benchmark/ holds the benchmark JSON the docs are rendered from"
    for path, block, body in ((ROOT / "docs" / "benchmark-results.md", PAGE_BLOCK, render_pages(results)),
                              (ROOT / "README.md", HEADLINE_BLOCK, render_headline(results))):
        text = path.read_text(encoding="utf-8")
        assert replace_block(text, block, body) == text, (
            f"{path.name} differs from what docs/benchmark/*.json renders: run `minitx benchmark-report`")
    headline = render_headline(results)
    assert len(table_rows(headline)) <= 12, "the README's headline keeps at most 12 rows; the rest is on the page"
    for result in results:  # each run's command at most once in the headline, and every run on the page
        assert headline.count(f"`{result['command']}`") <= 1 and describe_run(result) in render_pages(results)


def test_several_runs_render_one_after_the_other_each_with_its_machine(tmp_path):
    speed, quality = results(quality=False), results()
    quality.pop("workloads")
    quality["command"] = "minitx benchmark --quality_only"
    quality["quality"]["settings"]["num_threads"] = 2
    for name, result in (("1-speed.json", speed), ("2-quality.json", quality)):
        (tmp_path / name).write_text(json.dumps(result))
    loaded = read_results([tmp_path])
    assert [r["command"] for r in loaded] == ["minitx benchmark --quick --no_quality",
                                              "minitx benchmark --quality_only"]
    headline = render_headline(loaded)
    assert "`minitx benchmark --quality_only` (Test CPU 9000, 2 cores, device cpu, 2 torch threads; " in headline
    assert headline.count("| measure |") == 2  # one table per run, the quality run's own threads above it
    page = render_pages(loaded)
    assert page.index("### Speed") < page.index("### Quality at equal wall time, 30 s") and "on 2 threads" in page
    with pytest.raises(FileNotFoundError, match="no benchmark JSON there"):
        (tmp_path / "empty").mkdir()
        read_results([tmp_path / "empty"])
