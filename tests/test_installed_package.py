"""The wheel alone works: built, installed (not editable) into a fresh virtual environment where the
checkout cannot be imported, and used from an empty folder the way a user of the package would."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import free_port

REPO = Path(__file__).resolve().parent.parent


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        cwd=out, env=dict(os.environ))
    (path,) = out.glob("hf_minitx-*.whl")
    return path


def test_wheel_holds_presets_recipes_card_template_and_the_command(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for preset in ("tiny", "small", "gpt2-style", "gpt2-small", "base", "kjv-demo", "numbers-demo"):
        assert f"hf_minitx/training/presets/{preset}.json" in names
    assert "hf_minitx/tools/recipes/kjv-gpt.json" in names and "hf_minitx/hub/model_card.md" in names
    assert "hf_minitx/tools/experiment_presets/norm-position.json" in names  # `minitx experiment --preset`
    assert "hf_minitx/tools/explorer.html" in names  # the page template of `minitx explore`
    assert "hf_minitx/tools/benchmark/run.py" in names  # a subpackage: `minitx benchmark`
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "minitx = hf_minitx.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    assert not any(name.startswith(("scripts/", "tests/", "tokenizer/")) for name in names)


def test_packaged_template_is_the_repositorys_model_card():
    assert (REPO / "model_card.md").resolve() == (REPO / "hf_minitx" / "hub" / "model_card.md").resolve()


@pytest.mark.slow
def test_installed_wheel_trains_generates_stages_and_draws_from_an_empty_folder(wheel, tmp_path):
    venv = tmp_path / "venv"
    # system site-packages supply torch & co. (no download); hf_minitx itself comes from the wheel only
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path, env=dict(os.environ))
    python, minitx = venv / "bin" / "python", venv / "bin" / "minitx"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_MINITX_TRACEBACK")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
        cwd=tmp_path, env=env)
    work = tmp_path / "empty"
    work.mkdir()
    where = run([str(python), "-c", "import hf_minitx; print(hf_minitx.__file__)"], cwd=work, env=env).stdout
    assert Path(where.strip()).is_relative_to(venv), f"imported the checkout, not the wheel: {where}"

    run([str(minitx), "train", "--task", "causal-lm", "--dataset", "builtin:pydocs", "--preset", "tiny",
         "--max_steps", "5", "--block_size", "64", "--tokenizer_vocab_size", "300", "--output_dir", "out"],
        cwd=work, env=env)
    out = work / "out"
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: transformers" in card and "hf_minitx" in card
    assert json.loads((out / "config.json").read_text())["model_type"] == "minitx"

    generated = run([str(minitx), "generate", "--model", "out", "--prompt", "def ", "--max_new_tokens", "5"],
                    cwd=work, env=env).stdout
    assert generated.startswith("def ")
    staged = run([str(minitx), "push", "--model_dir", "out", "--dry_run", "staged"], cwd=work, env=env).stdout
    assert "dry run passed" in staged and (work / "staged" / "modeling_minitx.py").is_file()
    run([str(minitx), "visualize", "masks", "--out", "m.png"], cwd=work, env=env)
    assert (work / "m.png").read_bytes()[:4] == b"\x89PNG"
    run([str(minitx), "explore", "--model", "out", "--text", "def f(x):", "--out", "explore.html"], cwd=work, env=env)
    assert '"kind":"causal-lm"' in (work / "explore.html").read_text()


@pytest.mark.slow
def test_accelerate_launch_runs_the_installed_package_with_two_processes(wheel, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path, env=dict(os.environ))
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
        cwd=tmp_path, env=env)
    launch = [str(python), "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
              str(free_port()), "-m", "hf_minitx", "train"]
    run([*launch, "--dataset", "builtin:pydocs", "--preset", "tiny", "--max_steps", "3", "--block_size", "64",
         "--tokenizer_vocab_size", "300", "--per_device_train_batch_size", "2", "--output_dir", "two"],
        cwd=tmp_path, env=env)
    summary = json.loads((tmp_path / "two" / "training_summary.json").read_text())
    assert summary["num_processes"] == 2 and summary["steps"] == 3
