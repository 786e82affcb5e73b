"""docs/walkthrough.ipynb runs end to end on a CPU (nbclient, a fresh kernel) and trains the copy task to 100%;
the notebook is the one built from docs/walkthrough.py (jupytext), so the two cannot drift apart."""

from __future__ import annotations

import os
import re
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
        "docs/walkthrough.ipynb differs from docs/walkthrough.py; rebuild it: jupytext --to ipynb --update docs/walkthrough.py")


def _printed(notebook) -> str:
    text = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                pytest.fail(f"cell failed: {output.ename}: {output.evalue}\n{cell.source}")
            if output.output_type == "stream" and output.name == "stdout":
                text.append(output.text)
    return "".join(text)


@pytest.mark.slow
def test_the_walkthrough_runs_and_learns_the_copy_task(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    env_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DOCS.parent), env_path]))  # the kernel imports this checkout
    try:
        NotebookClient(notebook, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        if env_path is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = env_path
    printed = _printed(notebook)
    accuracy = re.search(r"copy accuracy: ([\d.]+)% of (\d+) held-out sequences", printed)
    assert accuracy, printed[-2000:]
    assert float(accuracy.group(1)) == 100.0 and int(accuracy.group(2)) == 256
    assert "held-out exact match: 100.0%" in printed
    assert "by hand == module: True" in printed and "same logits as before saving: True" in printed
    greedy = re.search(r"greedy: \[1, ([\d, ]+)\]", printed).group(1)
    assert greedy == "5, 9, 7, 4, 12, 6, 15, 8, 2"  # the copied source, then EOS
    assert re.search(r"wrote .*copy-explorer\.html", printed)
    assert not list(DOCS.glob("*.html")), "the walkthrough writes into a temporary folder, not docs/"
