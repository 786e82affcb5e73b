"""docs/walkthrough.ipynb runs end to end on a CPU (nbclient, a fresh kernel) and trains the copy task to 100%;
the notebook is the one built from docs/walkthrough.py (jupytext), so the two cannot drift apart, and the
outputs saved in it are the ones a run prints (every figure shown comes from running it)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

DOCS = Path(__file__).resolve().parents[1] / "docs"
NOTEBOOK, SOURCE = DOCS / "walkthrough.ipynb", DOCS / "walkthrough.py"


def _sources(notebook) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def test_the_notebook_is_built_from_its_source():
    built = jupytext.read(SOURCE)
    assert _sources(nbformat.read(NOTEBOOK, as_version=4)) == _sources(built), (
        "docs/walkthrough.ipynb differs from docs/walkthrough.py; "
        "rebuild it: jupytext --to ipynb --update docs/walkthrough.py")


def _printed(notebook) -> str:
    text = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                pytest.fail(f"cell failed: {output.ename}: {output.evalue}\n{cell.source}")
            if output.output_type == "stream" and output.name == "stdout":
                text.append(output.text)
    return "".join(text)


def _cell_outputs(notebook) -> list[str]:
    """Each code cell's printed text, less what differs from run to run or machine to machine: the versions,
    the temporary folder, the seconds, and the training log (float rounding of another CPU may shift it)."""
    volatile = [(r"^hf_minitx .*$", "<versions>"), (r"/\S*minitx-walkthrough-[^/\s]+", "<workdir>"),
                (r"\d+ s of training", "<seconds> s of training"), (r"\(\d+ kB\)", "(<size> kB)"),
                (r"^\[eval step .*\n", ""), (r"^\d+ steps, ", "<steps> steps, ")]
    texts = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        text = "".join(o.text for o in cell.get("outputs", []) if o.output_type == "stream" and o.name == "stdout")
        for pattern, replacement in volatile:
            text = re.sub(pattern, replacement, text, flags=re.M)
        texts.append(text)
    return texts


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Environment variables set for what starts inside (the notebook's kernel), then put back."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


@pytest.mark.slow
def test_the_walkthrough_runs_and_learns_the_copy_task(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    saved = _cell_outputs(notebook)
    # the kernel imports this checkout, and its temporary folders go under tmp_path (removed by pytest)
    python_path = os.pathsep.join(filter(None, [str(DOCS.parent), os.environ.get("PYTHONPATH")]))
    with _environment(PYTHONPATH=python_path, TMPDIR=str(tmp_path)):
        NotebookClient(notebook, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = _printed(notebook)
    accuracy = re.search(r"copy accuracy: ([\d.]+)% of (\d+) held-out sequences", printed)
    assert accuracy, printed[-2000:]
    assert float(accuracy.group(1)) == 100.0 and int(accuracy.group(2)) == 256
    assert "held-out exact match: 100.0%" in printed
    assert "by hand == module: True" in printed and "same logits as before saving: True" in printed
    greedy = re.search(r"greedy: \[1, ([\d, ]+)\]", printed).group(1)
    assert greedy == "5, 9, 7, 4, 12, 6, 15, 8, 2"  # the copied source, then EOS
    assert re.search(r"beam 4: \[1, ([\d, ]+)\]", printed).group(1) == greedy
    page = Path(re.search(r"wrote (\S+copy-explorer\.html)", printed).group(1))
    assert page.is_relative_to(tmp_path)
    assert not list(tmp_path.glob("minitx-walkthrough-*")), "the walkthrough's folder outlives its kernel"
    assert not list(DOCS.glob("*.html")), "the walkthrough writes into a temporary folder, not docs/"
    assert _cell_outputs(notebook) == saved, (
        "docs/walkthrough.ipynb shows outputs that this run does not print: "
        "run it again (Restart & Run All) and save it")
