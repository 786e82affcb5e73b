"""Two machines, simulated on one host: two `accelerate launch` launchers (machine ranks 0 and 1, one process each)
train to the same weights, bit for bit, as one launcher with two processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import free_port
from safetensors.torch import load_file
from test_train import REPO, causal_args, text_file  # noqa: F401 (text_file is a fixture)

COMMON = ("--max_steps", "4", "--eval_steps", "4", "--per_device_train_batch_size", "4", "--optimizer", "muon")


def launcher(*options: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--mixed_precision", "no", "--dynamo_backend", "no", *options]


@pytest.mark.slow
def test_two_launchers_train_the_weights_of_one_launcher_with_two_processes(text_file, tmp_path):  # noqa: F811
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    one, two = tmp_path / "one-machine", tmp_path / "two-machines"
    subprocess.run([*launcher("--num_machines", "1", "--main_process_port", str(free_port())), "-m", "hf_minitx",
                    "train", *causal_args(text_file, one, *COMMON)], check=True, env=env, cwd=REPO, timeout=240)
    port = str(free_port())
    machines = [subprocess.Popen(
        [*launcher("--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
                   "--main_process_port", port, "--same_network"),
         "-m", "hf_minitx", "train", *causal_args(text_file, two, *COMMON)],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [machine.communicate(timeout=240)[0] for machine in machines]
    assert [machine.returncode for machine in machines] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    expected, found = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert expected.keys() == found.keys()
    for name, tensor in expected.items():
        assert torch.equal(found[name], tensor), name
