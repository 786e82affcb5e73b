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
from conftest import free_port
from safetensors.torch import load_file

from hf_minitx.training.arguments import TrainArguments
from hf_minitx.training.prepare import check_sharding

SHARDED_SAVE = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from hf_minitx.models import MiniTxConfig, MiniTxForCausalLM
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


def test_the_final_save_writes_the_gathered_weights_of_a_sharded_model(tmp_path):
    done = subprocess.run([sys.executable, "-c", SHARDED_SAVE, str(tmp_path), str(free_port())],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "as-is: Attempted to access the data pointer on an invalid python storage" in done.stdout
    expected = torch.load(tmp_path / "expected.pt")
    saved = load_file(tmp_path / "gathered" / "model.safetensors")
    assert set(saved) == set(expected) - {"lm_head.weight"}  # the tied head is saved once, as save_pretrained does
    for name, tensor in saved.items():
        assert torch.equal(tensor, expected[name]), name
    assert json.loads((tmp_path / "gathered" / "training_summary.json").read_text()) == {"final_metrics": {}}


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_muon_is_refused_with_sharded_weights_and_adamw_is_not(optimizer):
    args = TrainArguments(optimizer=optimizer)
    check_sharding(DistributedType.MULTI_GPU, args)  # whole weights on every process
    if optimizer == "adamw":
        check_sharding(DistributedType.FSDP, args)
        return
    with pytest.raises(ValueError, match="--optimizer muon needs whole matrices.*with FSDP pass --optimizer adamw"):
        check_sharding(DistributedType.FSDP, args)
