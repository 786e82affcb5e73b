"""Every example runs: the bash and python code blocks of README.md and docs/*.md, in order, page by page.

Each page runs in a fresh temporary folder (its blocks share it, so a page may train a model and then generate
with it), offline, with torch.compile switched off (TORCH_COMPILE_DISABLE=1: the compiled path has its own tests
in tests/models/test_decode_fast_path.py). A block that cannot run here starts with the visible line
`# not run in CI: REASON`, and is skipped.

The pages also hold together, without running anything: every relative link and heading anchor resolves, the files
README's "Reading the code" names exist, and the how-to pages (Training, Performance) stay short (200 lines at
most), their research record living in docs/recipe-log.md and the benchmark's tables in docs/benchmark-results.md.
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


HOW_TO_PAGES = ("training.md", "performance.md")
HOW_TO_MAX_LINES = 200  # the whole page: tables rendered from benchmark JSON live on docs/benchmark-results.md
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def without_code(text: str) -> str:
    """A Markdown text without its fenced code blocks (a `# comment` there is no heading, a `[x](y)` no link)."""
    return re.sub(r"^```.*?^```$", "", text, flags=re.DOTALL | re.MULTILINE)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown text's headings (code blocks left out; a repeated heading gets -1, -2)."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", without_code(text), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
    return {slug if n == 0 else f"{slug}-{n}" for slug, count in seen.items() for n in range(count + 1)}


def test_anchors_follow_github():
    text = ("# Title\n## Muon's cost on a CPU, and more\n## Muon's cost on a CPU, and more\n"
            "```bash\n# not a heading\n```\n")
    assert anchors(text) == {"title", "muons-cost-on-a-cpu-and-more", "muons-cost-on-a-cpu-and-more-1"}


@pytest.mark.parametrize("name", HOW_TO_PAGES)
def test_how_to_pages_stay_short_and_leave_screens_to_the_recipe_log(name):
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= HOW_TO_MAX_LINES, (
        f"docs/{name} has {lines} lines (at most {HOW_TO_MAX_LINES}): move research records to docs/recipe-log.md "
        "and benchmark tables to docs/benchmark-results.md")
    assert "](recipe-log.md" in text, f"docs/{name} links to the recipe log"
    assert "| variant |" not in text, f"docs/{name} holds a screen table; screens go to docs/recipe-log.md"


def test_the_readme_names_the_files_to_read_in_order_and_they_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Reading the code\n(.*?)(?=^## )", readme, re.DOTALL | re.MULTILINE)
    assert section, "README.md has a '## Reading the code' section"
    files = re.findall(r"`((?:hf_minitx|docs)/[\w/.-]+\.(?:py|ipynb))`", section.group(1))
    assert len(files) >= 4, files
    assert [f for f in files if not (ROOT / f).is_file()] == [], "every file the section names exists"
    for name, path in re.findall(r"`(\w+)` in `([\w/.-]+\.py)`", section.group(1)):
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.MULTILINE), (
            f"README.md: `{name}` is defined in `{path}`")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_of_the_page_resolves(page):
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(without_code(text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_every_docs_page_the_code_cites_exists_with_its_section():
    """A docstring or comment that sends the reader to `docs/PAGE.md` (and, quoted after it, a section) must
    name a page that exists and a heading that page has: a moved section would leave the pointer stale."""
    cited = 0
    for path in sorted((ROOT / "hf_minitx").rglob("*.py")):
        text = path.read_text()
        for match in re.finditer(r"docs/([\w-]+\.md)(?:, \"([^\"]+)\")?", text):
            page, section = match.groups()
            cited += 1
            assert (ROOT / "docs" / page).is_file(), f"{path.relative_to(ROOT)} cites docs/{page}, which is gone"
            if section:
                headings = [line.lstrip("#").strip() for line in (ROOT / "docs" / page).read_text().splitlines()
                            if line.startswith("#")]
                assert any(h.startswith(section) for h in headings), (
                    f"{path.relative_to(ROOT)} cites the section {section!r} of docs/{page}, which has no such heading")
    assert cited >= 5
