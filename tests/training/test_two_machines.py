"""Two machines, simulated on one host: two `accelerate launch` launchers (machine ranks 0 and 1, one process each)
train to the same weights, bit for bit, as one launcher with two processes, also when one machine dies after a
checkpoint and both launchers resume."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from conftest import assert_same_weights, free_port
from test_train import REPO, causal_args, text_file  # noqa: F401 (text_file is a fixture)

COMMON = ("--max_steps", "24", "--eval_steps", "12", "--checkpointing_steps", "2", "--per_device_train_batch_size", "4",
          "--optimizer", "muon")


def launcher(*options: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--mixed_precision", "no", "--dynamo_backend", "no", *options]


def two_machines(corpus, output_dir, *extra: str) -> list[subprocess.Popen]:
    """Launchers of machine ranks 0 and 1 (one process each) training into one shared ``output_dir``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    port = str(free_port())
    return [subprocess.Popen(
        [*launcher("--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
                   "--main_process_port", port, "--same_network"),
         "-m", "hf_minitx", "train", *causal_args(corpus, output_dir, *COMMON, *extra)],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]


def finish(machines: list[subprocess.Popen]) -> None:
    outputs = [machine.communicate(timeout=240)[0] for machine in machines]
    assert [machine.returncode for machine in machines] == [0, 0], "\n".join(o[-2000:] for o in outputs)


def kill_machine(machine: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process it started, as when its machine goes down."""
    root = psutil.Process(machine.pid)
    for process in [root, *root.children(recursive=True)]:
        process.kill()
    machine.communicate()


@pytest.mark.slow
def test_two_launchers_train_the_weights_of_one_launcher_and_resume_after_one_machine_dies(text_file, tmp_path):  # noqa: F811
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    one, two, killed = tmp_path / "one-machine", tmp_path / "two-machines", tmp_path / "killed"
    subprocess.run([*launcher("--num_machines", "1", "--main_process_port", str(free_port())), "-m", "hf_minitx",
                    "train", *causal_args(text_file, one, *COMMON)], check=True, env=env, cwd=REPO, timeout=240)
    finish(two_machines(text_file, two))
    assert_same_weights(one, two)

    # machine 1 goes down (kill -9 of its launcher and its worker) once the first checkpoint is written
    machines = two_machines(text_file, killed)
    deadline = time.monotonic() + 200
    while not (killed / "checkpoint-2" / "run_state.json").is_file():
        assert time.monotonic() < deadline and machines[0].poll() is None, machines[0].communicate()[0][-2000:]
        time.sleep(0.02)
    kill_machine(machines[1])
    machines[0].communicate(timeout=120)  # the survivor's collective fails: it exits
    assert machines[0].returncode != 0 and not (killed / "model.safetensors").exists()
    finish(two_machines(text_file, killed, "--resume_from_checkpoint", "latest"))
    assert_same_weights(one, killed)
