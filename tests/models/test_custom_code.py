"""The model files are Hub custom code: `save_pretrained` copies them next to the weights, so they may
import only the standard library, torch, transformers and each other (`from .x import y`)."""

import ast
import json
import os
import subprocess
import sys
import textwrap
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


CLEAN_LOAD_SCRIPT = textwrap.dedent(
    """
    import json, sys, traceback
    sys.modules["hf_minitx"] = None  # only the folder's own code may be used
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
    loaded = sorted({name.rsplit(".", 1)[-1] for name in sys.modules
                     if name.startswith("transformers_modules.") and name.endswith("_minitx")})
    try:
        model(torch.tensor([[1, 99]]))  # id 99 >= vocab_size: refused by checks_minitx.check_inputs
        refusal = None
    except ValueError as error:
        refusal = [str(error), traceback.extract_tb(error.__traceback__)[-1].filename]
    print(json.dumps({"loaded": loaded, "refusal": refusal, "module": type(model).__module__}))
    """
)


def test_saved_folder_holds_every_model_file_and_loads_them_without_hf_minitx(tmp_path):
    """The input checks (checks_minitx.py) and the heads' shared part (lm_head_minitx.py) are Hub files like the
    others: the saved folder holds them, and a process that cannot import hf_minitx loads all of them from it
    and refuses a bad id with the checks' message."""
    folder = tmp_path / "model"
    MiniTxForCausalLM(MiniTxConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=16)).save_pretrained(folder)
    assert {"checks_minitx.py", "lm_head_minitx.py"} <= {p.name for p in folder.glob("*.py")}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    done = subprocess.run([sys.executable, "-c", CLEAN_LOAD_SCRIPT, str(folder)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loaded"] == sorted(models.MODEL_FILES)
    assert not report["module"].startswith("hf_minitx")
    message, raised_in = report["refusal"]
    assert "Token ids must lie in [0, 32)" in message
    assert Path(raised_in).name == "checks_minitx.py" and Path(raised_in).is_relative_to(tmp_path / "modules")
