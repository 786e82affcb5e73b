"""Every example runs: the bash and python code blocks of README.md and docs/*.md, in order, page by page.

Each page runs in a fresh temporary folder (its blocks share it, so a page may train a model and then generate
with it), offline, with torch.compile switched off (TORCH_COMPILE_DISABLE=1: the compiled path has its own tests
in tests/models/test_decode_fast_path.py). A block that cannot run here starts with the visible line
`# not run in CI: REASON`, and is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(bash|python)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
NOT_RUN = re.compile(r"# not run in CI: (\S.*)")
BLOCK_TIMEOUT_S = 300


def code_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, code, line) of every ```bash and ```python block of a Markdown text."""
    return [(match.group(1), match.group(2), text.count("\n", 0, match.start()) + 1) for match in FENCE.finditer(text)]


def skip_reason(code: str) -> str | None:
    """The reason a block is not run (its first line `# not run in CI: REASON`), or None."""
    match = NOT_RUN.fullmatch(code.split("\n", 1)[0].strip())
    return match.group(1) if match else None


def test_blocks_are_found_and_marked_blocks_give_their_reason():
    text = ("Intro\n\n```bash\necho one\n```\n\n```python\n# not run in CI: needs a GPU\nimport torch\n```\n\n"
            "```text\nnot code\n```\n\n```bash\n# not run in CI:\nls\n```\n")
    blocks = code_blocks(text)
    assert [(language, line) for language, _, line in blocks] == [("bash", 3), ("python", 7), ("bash", 16)]
    assert [skip_reason(code) for _, code, _ in blocks] == [None, "needs a GPU", None]  # no reason: it runs
    every = [block for page in PAGES for block in code_blocks(page.read_text(encoding="utf-8"))]
    assert len(every) > 20 and sum(skip_reason(code) is None for _, code, _ in every) > 15


def _environment(folder: Path) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TORCH_COMPILE_DISABLE": "1", "HOME": os.environ.get("HOME", str(folder))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_code_block_of_the_page_runs(page, tmp_path):
    env = _environment(tmp_path)
    for language, code, line in code_blocks(page.read_text(encoding="utf-8")):
        if skip_reason(code):
            continue
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        assert done.returncode == 0, (f"{page.name}:{line}: the {language} block failed (exit {done.returncode})\n"
                                      f"{code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
