"""Scripts end bad input with one `error:` line and exit code 2, not a traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_minitx.cli import run_cli

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_run_cli_turns_user_errors_into_exit_code_2(capsys):
    def bad():
        raise ValueError("block_size 4096 is larger than max_position_embeddings 512")

    assert run_cli(bad) == 2
    assert capsys.readouterr().err.strip() == "error: block_size 4096 is larger than max_position_embeddings 512"
    assert run_cli(lambda: 0) == 0 and run_cli(lambda: None) == 0 and run_cli(lambda: 3) == 3


def test_run_cli_lets_programming_errors_through():
    def broken():
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        run_cli(broken)


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate.py", "--model", "no/such/folder", "--prompt", "hi"], "is not a model folder"),
        (["train.py", "--dataset", "builtin:pydocs", "--preset", "nope", "--output_dir", "x"], "unknown preset 'nope'"),
    ],
)
def test_scripts_print_one_error_line(tmp_path, argv, message):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HF_MINITX_TRACEBACK", None)
    result = subprocess.run([sys.executable, str(SCRIPTS / argv[0]), *argv[1:]], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and message in result.stderr
    assert result.stderr.lstrip().startswith("error:")
