"""The model: the eight files `save_pretrained` copies next to the weights as Hub custom code.

They import only torch, transformers and each other (`from .x import y`), so a saved folder loads with
`trust_remote_code=True` where hf_minitx is not installed.
"""

from .configuration_minitx import MiniTxConfig
from .modeling_minitx import (
           IGNORE_INDEX,
           MiniTxForCausalLM,
           MiniTxForConditionalGeneration,
           MiniTxModel,
           MiniTxPreTrainedModel,
)

MODEL_FILES = ("configuration_minitx", "checks_minitx", "attention_minitx", "positions_minitx", "layers_minitx",
               "cache_minitx", "decoding_minitx", "lm_head_minitx", "modeling_minitx")

__all__ = ["IGNORE_INDEX", "MODEL_FILES", "MiniTxConfig", "MiniTxPreTrainedModel", "MiniTxModel", "MiniTxForCausalLM",
           "MiniTxForConditionalGeneration"]
