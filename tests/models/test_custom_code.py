"""The model files are Hub custom code: `save_pretrained` copies them next to the weights, so they may
import only the standard library, torch, transformers and each other (`from .x import y`)."""

import ast
import sys
from pathlib import Path

import pytest

import hf_minitx.models as models
from hf_minitx import MiniTxConfig, MiniTxForCausalLM

MODEL_DIR = Path(models.__file__).parent
ALLOWED_TOP_LEVEL = {"torch", "transformers"} | set(sys.stdlib_module_names)


def imports_of(path: Path) -> list[tuple[int, str | None, int]]:
    """(relative level, module, line) of every import statement in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(0, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module, node.lineno))
    return found


@pytest.mark.parametrize("name", models.MODEL_FILES)
def test_model_file_imports_only_torch_transformers_and_siblings(name):
    path = MODEL_DIR / f"{name}.py"
    for level, module, line in imports_of(path):
        where = f"{path.name}:{line}"
        if level == 0:
            assert module.split(".")[0] in ALLOWED_TOP_LEVEL, f"{where} imports {module}"
        else:  # only `from .sibling import name`: deeper or package imports break loading elsewhere
            assert level == 1 and module in models.MODEL_FILES, f"{where} imports {'.' * level}{module or ''}"


def test_model_folder_lists_exactly_the_model_files_as_custom_code(tmp_path):
    MiniTxForCausalLM(MiniTxConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=16)).save_pretrained(tmp_path)
    copied = sorted(p.stem for p in tmp_path.glob("*.py"))
    assert copied == sorted(models.MODEL_FILES)


def test_no_package_file_reaches_into_the_checkout():
    package = MODEL_DIR.parent
    for path in package.rglob("*.py"):
        text = path.read_text()
        for marker in ("parent.parent", "parents[", '"scripts"', "scripts/configs"):
            assert marker not in text, f"{path.relative_to(package)} refers to {marker}: read package data instead"
