"""Sharded training (FSDP). Accelerate turns an FSDP config on for GPUs only, so these tests shard a model with
torch's own `fully_shard` on the CPU (gloo, one process) to check what our code does with sharded weights; a
GPU run was checked by hand (docs/training.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from accelerate.utils import DistributedType
from accelerate.utils.constants import FSDP_MODEL_NAME
from conftest import free_port
from safetensors.torch import load_file

from hf_minitx.models import MODEL_FILES, MiniTxConfig, MiniTxForCausalLM
from hf_minitx.training.arguments import TrainArguments
from hf_minitx.training.checkpoints import STATE_FILES, check_checkpoint_files, check_checkpoint_fits
from hf_minitx.training.setup import check_sharding

# one process shards a tiny model over gloo; argv: a folder, a free port
SHARDED_MODEL = """
    import os, sys, torch, torch.distributed as dist
    from pathlib import Path
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from hf_minitx.models import MiniTxConfig, MiniTxForCausalLM
    from hf_minitx.training.best import BestWeights
    from hf_minitx.training.outputs import save_final_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = MiniTxForCausalLM(MiniTxConfig(vocab_size=64, hidden_size=32, num_attention_heads=2,
                                           num_hidden_layers=2, intermediate_size=64, max_position_embeddings=32))
    mesh = init_device_mesh("cpu", (1,))
    for layer in model.model.decoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 64, (2, 16))
"""

SHARDED_SAVE = textwrap.dedent(SHARDED_MODEL + """
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    full = {name: tensor.full_tensor().clone() for name, tensor in model.state_dict().items()}
    torch.save(full, sys.argv[1] + "/expected.pt")
    summary = {"final_metrics": {}}
    try:  # what the final save did before: the sharded parameters cannot be written as they are
        save_final_model(model, None, sys.argv[1] + "/as-is", summary, max_new_tokens=4)
        print("as-is: saved")
    except RuntimeError as error:
        print("as-is:", error)
    # what accelerator.get_state_dict does for FSDP2: gather the full weights on the CPU
    gathered = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    save_final_model(model, None, sys.argv[1] + "/gathered", summary, max_new_tokens=4, state_dict=gathered)
    dist.destroy_process_group()
""")


def run_sharded(script: str, folder) -> subprocess.CompletedProcess:
    """Run a SHARDED_MODEL script; it must succeed, and writing the sharded weights as they are must fail."""
    done = subprocess.run([sys.executable, "-c", script, str(folder), str(free_port())],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "as-is: Attempted to access the data pointer on an invalid python storage" in done.stdout
    return done


def test_the_final_save_writes_the_gathered_weights_of_a_sharded_model(tmp_path):
    run_sharded(SHARDED_SAVE, tmp_path)
    expected = torch.load(tmp_path / "expected.pt")
    saved = load_file(tmp_path / "gathered" / "model.safetensors")
    assert set(saved) == set(expected) - {"lm_head.weight"}  # the tied head is saved once, as save_pretrained does
    for name, tensor in saved.items():
        assert torch.equal(tensor, expected[name]), name
    assert json.loads((tmp_path / "gathered" / "training_summary.json").read_text()) == {"final_metrics": {}}
    # FSDP makes the model an instance of torch's FSDPMiniTxForCausalLM: the folder's custom code stays ours
    code = sorted(path.name for path in (tmp_path / "gathered").glob("*.py"))
    assert code == sorted(f"{name}.py" for name in MODEL_FILES), code
    auto_map = json.loads((tmp_path / "gathered" / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForCausalLM"] == "modeling_minitx.MiniTxForCausalLM"


BEST_OF_SHARDED = textwrap.dedent(SHARDED_MODEL + """
    gather = lambda: get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    def step():
        model(input_ids=ids, labels=ids).loss.backward(); optimizer.step(); optimizer.zero_grad()
    step()
    best = BestWeights()
    try:  # what --load_best_model_at_end did before: a copy of the sharded parameters, which cannot be written
        copied = BestWeights()
        copied.offer(model, 1, {"eval_loss": 1.0})
        copied.save(Path(sys.argv[1]))
        print("as-is: saved")
    except RuntimeError as error:
        print("as-is:", error)
    best.offer(model, 1, {"eval_loss": 1.0}, weights=gather())
    kept = {name: tensor.clone() for name, tensor in best.weights.items()}
    best.save(Path(sys.argv[1]))
    step()
    moved = max((gather()[name] - kept[name]).abs().max().item() for name in kept)
    best.restore_into(model, sharded=True)
    back = max((gather()[name] - kept[name]).abs().max().item() for name in kept)
    print(f"moved {moved} back {back}")
    dist.destroy_process_group()
""")


def test_the_best_weights_of_a_sharded_model_are_gathered_saved_and_put_back(tmp_path):
    done = run_sharded(BEST_OF_SHARDED, tmp_path)
    moved, back = (float(word) for word in done.stdout.split("moved ")[1].split(" back "))
    assert moved > 1e-4 and back == 0.0
    saved = load_file(tmp_path / "best_weights.safetensors")
    assert "model.decoder.layers.0.self_attn.q_proj.weight" in saved
    assert all(not isinstance(t, torch.distributed.tensor.DTensor) for t in saved.values())


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_muon_is_refused_with_sharded_weights_and_adamw_is_not(optimizer):
    args = TrainArguments(optimizer=optimizer)
    check_sharding(DistributedType.MULTI_GPU, args)  # whole weights on every process
    if optimizer == "adamw":
        check_sharding(DistributedType.FSDP, args)
        return
    with pytest.raises(ValueError, match="--optimizer muon needs whole matrices.*with FSDP pass --optimizer adamw"):
        check_sharding(DistributedType.FSDP, args)


def test_a_sharded_state_dict_config_is_refused_with_checkpoints_only():
    args = TrainArguments(optimizer="adamw", checkpointing_steps=20)
    check_sharding(DistributedType.FSDP, args, "StateDictType.FULL_STATE_DICT")
    check_sharding(DistributedType.FSDP, TrainArguments(optimizer="adamw"), "StateDictType.SHARDED_STATE_DICT")
    with pytest.raises(ValueError, match="asks for StateDictType.SHARDED_STATE_DICT; set fsdp_state_dict_type: "
                                         "FULL_STATE_DICT"):
        check_sharding(DistributedType.FSDP, args, "StateDictType.SHARDED_STATE_DICT")


def test_a_checkpoint_of_fsdp_whole_weights_is_checked_and_fits(tmp_path):
    """Accelerate writes an FSDP model's whole weights (FULL_STATE_DICT) as pytorch_model_fsdp.bin; a GPU run's
    resume was refused as 'incomplete' when only model.safetensors and pytorch_model.bin counted."""
    model = MiniTxForCausalLM(MiniTxConfig(vocab_size=64, hidden_size=32, num_attention_heads=2, num_hidden_layers=2,
                                           intermediate_size=64, max_position_embeddings=32))
    checkpoint = tmp_path / "checkpoint-20"
    checkpoint.mkdir()
    for name in STATE_FILES:
        torch.save({}, checkpoint / name)
    with pytest.raises(ValueError, match="model.safetensors, pytorch_model.bin or pytorch_model_fsdp.bin is missing"):
        check_checkpoint_files(checkpoint)
    torch.save(model.state_dict(), checkpoint / f"{FSDP_MODEL_NAME}.bin")
    check_checkpoint_files(checkpoint)
    check_checkpoint_fits(checkpoint, model)
    wider = MiniTxForCausalLM(MiniTxConfig(vocab_size=64, hidden_size=64, num_attention_heads=2, num_hidden_layers=2,
                                           intermediate_size=64, max_position_embeddings=32))
    with pytest.raises(ValueError, match="pytorch_model_fsdp.bin does not fit this model"):
        check_checkpoint_fits(checkpoint, wider)
