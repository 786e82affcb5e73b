"""Load a model folder the way someone without hf_minitx would, then generate; prints one JSON line.

Run as a fresh interpreter (`hub.check_loads_without_package` does it): the first statement makes
`import hf_minitx` fail, so everything must come from the folder's own code via trust_remote_code.
This file imports nothing from hf_minitx on purpose.

Usage: python remote_load_check.py MODEL_DIR PROMPT MAX_NEW_TOKENS
"""

import sys

sys.modules["hf_minitx"] = None  # any `import hf_minitx...` now raises ImportError

import json  # noqa: E402


def main(model_dir: str, prompt: str, max_new_tokens: int) -> dict:
    """Load config, tokenizer and model with trust_remote_code=True and greedily generate from `prompt`."""
    try:
        import hf_minitx  # noqa: F401
    except ImportError:
        blocked = True
    else:  # pragma: no cover - only if the guard above stopped working
        blocked = False
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(model_dir, trust_remote_code=True).eval()
    inputs = tokenizer([prompt], return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=max_new_tokens, min_new_tokens=1, do_sample=False)
    start = 1 if config.is_encoder_decoder else inputs["input_ids"].shape[1]  # seq2seq output opens with decoder_start
    new_ids = output[0, start:]
    return {
        "hf_minitx_blocked": blocked,
        "config_class": f"{type(config).__module__}.{type(config).__name__}",
        "model_class": f"{type(model).__module__}.{type(model).__name__}",
        "tokenizer_class": type(tokenizer).__name__,
        "output_ids": output[0].tolist(),
        "num_new_tokens": int(new_ids.numel()),
        "text": tokenizer.decode(new_ids, skip_special_tokens=True),
    }


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    print("REMOTE_LOAD_RESULT " + json.dumps(result))
