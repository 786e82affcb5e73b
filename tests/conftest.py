"""Shared test setup: offline Hugging Face, one torch thread, tiny model factories."""

import fcntl
import json
import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from hf_minitx.models import decoding_minitx  # noqa: E402

# generate() reads the weights in the decode layout from this many new tokens on; the tests' calls are short
DECODE_LAYOUT_MIN_NEW_TOKENS = decoding_minitx.DECODE_LAYOUT_MIN_NEW_TOKENS


@pytest.fixture(autouse=True)
def decode_layout_for_every_generate_call(monkeypatch):
    """Every test's generate() call takes the decode layout, so parity tests cover it whatever their length."""
    monkeypatch.setattr(decoding_minitx, "DECODE_LAYOUT_MIN_NEW_TOKENS", 1)


def free_port() -> int:
    """A TCP port free on this host now, for a process group's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tiny_config(**overrides):
    """A MiniTxConfig small enough for sub-second tests."""
    from hf_minitx import MiniTxConfig

    values = dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )
    values.update(overrides)
    return MiniTxConfig(**values)


# Every architecture option at once, the extra pieces too (zero_init_head left out: zero logits would make parity
# vacuous).
ALL_OPTIONS = dict(norm_type="rmsnorm", hidden_act="swiglu", qk_norm=True, tie_word_embeddings=False,
                   final_logit_softcap=0.5, attention_gate=True, value_embeddings=True, unet_skips=True)


@pytest.fixture
def make_config():
    return tiny_config


def tiny_causal(**overrides):
    """A seeded, tiny MiniTxForCausalLM in eval mode."""
    from hf_minitx import MiniTxForCausalLM

    torch.manual_seed(0)
    return MiniTxForCausalLM(tiny_config(**overrides)).eval()


def tiny_seq2seq(**overrides):
    """A seeded, tiny MiniTxForConditionalGeneration in eval mode."""
    from hf_minitx import MiniTxForConditionalGeneration

    torch.manual_seed(0)
    return MiniTxForConditionalGeneration(tiny_config(is_encoder_decoder=True, **overrides)).eval()


def random_ids(batch: int, length: int, seed: int = 0, vocab: int = 64) -> torch.Tensor:
    """(batch, length) ids that avoid the special tokens 0-2."""
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


PERIOD = (5, 9, 14, 22, 31, 40, 47)  # the repeating token pattern `train_on_pattern` teaches


def train_on_pattern(model, steps: int = 150):
    """Train `model` (about a second for a tiny one) to continue PERIOD, so that its greedy tokens have clear
    margins: rounding cannot flip them, and draft tokens that follow the pattern get accepted. Returns it in eval
    mode. A seq2seq model learns to write the pattern whatever the source."""
    sequence = torch.tensor(PERIOD * 6)  # (42,)
    batch = torch.stack([sequence[s:s + 32] for s in torch.arange(8) % len(PERIOD)])  # (8, 32)
    inputs = {"input_ids": batch[:, :8], "labels": batch} if model.config.is_encoder_decoder else {
        "input_ids": batch, "labels": batch}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(**inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


# Run the training, and SIGKILL the process right after its first checkpoint is complete (kill -9).
KILL_AFTER_FIRST_CHECKPOINT = """
import os, signal, sys
import hf_minitx.training.checkpoints as checkpoints
import hf_minitx.training.loop as loop
original = checkpoints.rotate_checkpoints
def rotate_then_die(*args, **kwargs):
    original(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
checkpoints.rotate_checkpoints = rotate_then_die
loop.main(sys.argv[1:])
"""


# `accelerate launch THIS_FILE train ...`: `minitx train`, which records, as the process group is destroyed, how many
# data-parallel wrappers still exist in that process (garbage not yet collected counts: a wrapper freed after its
# group frees the group's last reference holding the interpreter lock, a hang at exit now and then).
WRAPPERS_AT_GROUP_END = """
import gc, os, sys
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from hf_minitx.cli import main
destroy = dist.destroy_process_group
def count_then_destroy(*args, **kwargs):
    live = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    with open(os.path.join(os.environ["WRAPPERS_RECORD"], f"rank-{dist.get_rank()}"), "w") as record:
        record.write(str(live))
    return destroy(*args, **kwargs)
dist.destroy_process_group = count_then_destroy
sys.exit(main(sys.argv[1:]))
"""


def kill_then_resume(make_args, straight, killed, env, cwd, between=None) -> None:
    """Train ``straight`` uninterrupted; train ``killed`` until SIGKILL right after its first checkpoint, call
    ``between(killed)``, then resume it with ``--resume_from_checkpoint latest``. ``make_args(folder)`` gives
    the `minitx train` arguments of a run in ``folder``."""
    import signal
    import subprocess
    import sys

    train = [sys.executable, "-m", "hf_minitx", "train"]
    subprocess.run([*train, *make_args(straight)], check=True, env=env, cwd=cwd, timeout=300)
    died = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_CHECKPOINT, *make_args(killed)],
                          env=env, cwd=cwd, timeout=300, capture_output=True)
    assert died.returncode == -signal.SIGKILL, died.stderr.decode()[-2000:]
    if between is not None:
        between(killed)
    subprocess.run([*train, *make_args(killed), "--resume_from_checkpoint", "latest"], check=True, env=env, cwd=cwd,
                   timeout=300)


def assert_same_weights(first, second) -> None:
    """The model.safetensors of two run folders hold the same tensors, bit for bit."""
    from safetensors.torch import load_file

    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


REPO = Path(__file__).resolve().parents[1]
HOLD = """
import sys, time
from pathlib import Path
from hf_minitx.folders import lock_folder
lock_folder(Path(sys.argv[1]), command="train")
print("LOCKED", flush=True)
time.sleep(600)
"""


def hold_lock(folder: Path) -> subprocess.Popen:
    """Another process that takes the folder's lock (as a training run does) and lives on."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "LOCKED"
    return proc


@contextmanager
def another_writer(lock: Path, **owner):
    """The lock file ``lock`` held as another live process would hold it (an OS lock on its own open file, which
    this process's lock attempts meet as another writer's), with ``owner`` as its JSON."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps(owner).encode())
        yield lock
    finally:
        os.close(fd)


def second_writer(argv: list[str]) -> subprocess.CompletedProcess:
    """Run `minitx ARGV` as another process (while this one writes) and return what it did."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HF_MINITX_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "hf_minitx", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
