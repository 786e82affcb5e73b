# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A Transformer, step by step, with hf_minitx
#
# This walkthrough follows the path of the original notebooks: positions, masks, attention, several heads,
# an encoder layer and a decoder layer, the two models, training on the copy task, generation, saving and
# loading through Hugging Face's Auto classes, and a look inside with the explorer. Every step calls the
# library's own functions and classes, and every number printed here comes from running it (CI runs this
# notebook on a CPU in about a minute).
#
# The source is `docs/walkthrough.py` (jupytext, percent format); `docs/walkthrough.ipynb` is built from it
# with `jupytext --to ipynb --update docs/walkthrough.py`.

# %%
import math
import tempfile
from pathlib import Path

import torch

import hf_minitx  # registers the "minitx" model type with the Auto classes
from hf_minitx import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration

torch.manual_seed(0)
torch.set_num_threads(1)  # models this small train fastest on one thread (and leave the other cores alone)
torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
scratch = tempfile.TemporaryDirectory(prefix="minitx-walkthrough-")  # removed when the kernel stops
workdir = Path(scratch.name)
print("hf_minitx", hf_minitx.__version__, "· torch", torch.__version__)

# %% [markdown]
# ## 1. Positions: the sinusoidal table
#
# Attention sees a set, not a sequence, so each position gets a vector added to its token's embedding.
# The paper's table: `PE[pos, 2i] = sin(pos / 10000^(2i/d))`, `PE[pos, 2i+1] = cos(pos / 10000^(2i/d))`.
# Low dimensions turn fast, high dimensions slowly.

# %%
from hf_minitx.models.positions_minitx import rope_inverse_frequencies, sinusoidal_table

table = sinusoidal_table(6, 8)  # (positions, dim)
print(table)
pos, i, d = 3, 1, 8
by_hand = math.sin(pos / 10000 ** (2 * i / d))
print(f"PE[{pos}, {2 * i}] = sin({pos} / 10000^({2 * i}/{d})) = {by_hand:.4f}; the table says {table[pos, 2 * i]:.4f}")
similarity = table @ table.T  # depends only on the distance between positions
print("PE[1]·PE[2] =", round(similarity[1, 2].item(), 4), " PE[3]·PE[4] =", round(similarity[3, 4].item(), 4))
print("rotary (RoPE) frequencies of a 8-wide head:", rope_inverse_frequencies(8, 10000.0))

# %% [markdown]
# ## 2. Masks
#
# `True` means "may attend". A decoder hides the future (causal mask); a batch hides its padding.

# %%
from hf_minitx.models.attention_minitx import causal_mask, padding_mask, scaled_dot_product_attention

print("causal mask (5 positions):\n", causal_mask(5, 5)[0, 0].int())
attention_mask = torch.tensor([[0, 0, 1, 1, 1]])  # two left-padding tokens
print("padding mask:\n", padding_mask(attention_mask, 5)[0, 0].int())
print("both:\n", (causal_mask(5, 5) & padding_mask(attention_mask, 5))[0, 0].int())

# %% [markdown]
# ## 3. Scaled dot-product attention, with the numbers
#
# `softmax(Q Kᵀ / sqrt(d_k)) V`: three queries and three keys of width 4, one batch, one head.

# %%
q = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])[None, None]  # (1, 1, 3, 4)
k = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])[None, None]
v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])[None, None]  # (1, 1, 3, 2)
scores = q @ k.transpose(-2, -1) / math.sqrt(4)
print("scores Q·Kᵀ/sqrt(4):\n", scores[0, 0])
output, weights = scaled_dot_product_attention(q, k, v)
print("weights (each row sums to 1):\n", weights[0, 0])
print("output = weights · V:\n", output[0, 0])
print("same as softmax by hand:", torch.allclose(weights, torch.softmax(scores, -1)))
_, causal_weights = scaled_dot_product_attention(q, k, v, is_causal=True)
print("with the causal mask, query 0 sees only key 0:\n", causal_weights[0, 0])

# %% [markdown]
# ## 4. Several heads
#
# `MiniTxAttention(config, layer_idx)` projects the input into `num_attention_heads` queries, keys and
# values of width `head_dim`, attends in each head separately, concatenates and projects back. Below the
# module's output is rebuilt by hand from its own projections and `scaled_dot_product_attention`.

# %%
from hf_minitx.models.layers_minitx import MiniTxAttention, MiniTxDecoderLayer, MiniTxEncoderLayer

config = MiniTxConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
                      intermediate_size=32, max_position_embeddings=16, is_encoder_decoder=True)
config._attn_implementation = "eager"  # the hand-written path, which returns the weights
attention = MiniTxAttention(config, layer_idx=0).eval()
x = torch.randn(1, 5, 16)  # (batch, seq, hidden)
out, heads = attention(x)
print("output", tuple(out.shape), "weights (batch, heads, queries, keys)", tuple(heads.shape))


def split(t: torch.Tensor) -> torch.Tensor:
    return t.view(1, 5, 4, 4).transpose(1, 2)  # (batch, heads, seq, head_dim)


manual, _ = scaled_dot_product_attention(split(attention.q_proj(x)), split(attention.k_proj(x)),
                                         split(attention.v_proj(x)))
manual = attention.o_proj(manual.transpose(1, 2).reshape(1, 5, 16))
print("by hand == module:", torch.allclose(manual, out, atol=1e-6))
print("what position 0 looks at, head by head:\n", heads[0, :, 0])

# %% [markdown]
# ## 5. One encoder layer and one decoder layer
#
# An encoder layer is self-attention then a feed-forward block, each with a residual connection and a
# LayerNorm (pre-LN here: `x + f(LN(x))`). A decoder layer adds causal self-attention and cross-attention
# over the encoder's output.

# %%
encoder_layer = MiniTxEncoderLayer(config, 0).eval()
decoder_layer = MiniTxDecoderLayer(config, 0).eval()
source = torch.randn(1, 6, 16)
target = torch.randn(1, 4, 16)
encoded, encoder_weights = encoder_layer(source)
decoded, self_weights, cross_weights = decoder_layer(target, causal_mask(4, 4), None, encoded, None)
print("encoder layer:", tuple(source.shape), "->", tuple(encoded.shape),
      "· self-attention", tuple(encoder_weights.shape))
print("decoder layer:", tuple(target.shape), "->", tuple(decoded.shape), "· self", tuple(self_weights.shape),
      "· cross", tuple(cross_weights.shape))
print("decoder self-attention of head 0 (causal: zeros above the diagonal):\n", self_weights[0, 0])

# %% [markdown]
# ## 6. Both models from one config
#
# One `MiniTxConfig` builds a decoder-only language model or the paper's encoder-decoder.

# %%
causal = MiniTxForCausalLM(MiniTxConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=32))
seq2seq = MiniTxForConditionalGeneration(MiniTxConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=64,
                                                      max_position_embeddings=32, is_encoder_decoder=True))
ids = torch.tensor([[5, 6, 7, 8]])
print("decoder-only:   ", f"{causal.num_parameters():,} parameters, logits", tuple(causal(ids).logits.shape))
print("encoder-decoder:", f"{seq2seq.num_parameters():,} parameters, logits",
      tuple(seq2seq(input_ids=ids, decoder_input_ids=ids[:, :2]).logits.shape))

# %% [markdown]
# ## 7. Training the copy task
#
# The paper's toy task: the output is the input. `hf_minitx.tools.experiments` builds the
# encoder-decoder and trains it with the package's one training loop (the loop `minitx train` uses),
# stopping when greedy decoding gets every held-out sequence right.

# %%
from hf_minitx.tools.experiments import ExperimentConfig, make_batch, run_experiment

copy_config = ExperimentConfig(task="copy", output_dir=str(workdir / "copy"), overwrite=True)
summary = run_experiment(copy_config)
model = summary["model"].eval()
exact = summary["final_metrics"]["eval_exact_match"]
print(f"{summary['steps']} steps, {summary['train_seconds']:.0f} s of training")
print(f"held-out exact match: {exact:.1f}%")

# %% [markdown]
# The same figure, recomputed here with `generate()` on the held-out sequences (made with the seed the
# experiment holds out):

# %%
held_out = make_batch(copy_config, copy_config.eval_examples, torch.Generator().manual_seed(copy_config.seed + 1))
width = held_out["labels"].shape[1]
with torch.no_grad():
    generated = model.generate(input_ids=held_out["input_ids"], attention_mask=held_out["attention_mask"],
                               max_new_tokens=width, do_sample=False)[:, 1:]
generated = torch.nn.functional.pad(generated, (0, width - generated.shape[1]))
known = held_out["labels"] != -100
correct = ((generated == held_out["labels"]) | ~known).all(dim=1)
print(f"copy accuracy: {100 * correct.float().mean():.1f}% of {len(correct)} held-out sequences")

# %% [markdown]
# ## 8. Greedy and beam generation
#
# `generate()` is transformers' own, with a key-value cache.

# %%
source_ids = torch.tensor([[5, 9, 7, 4, 12, 6, 15, 8, 2]])  # tokens then EOS (id 2)
greedy = model.generate(input_ids=source_ids, max_new_tokens=12, do_sample=False)
beam = model.generate(input_ids=source_ids, max_new_tokens=12, num_beams=4, do_sample=False)
print("source:", source_ids[0].tolist())
print("greedy:", greedy[0].tolist())
print("beam 4:", beam[0].tolist())

# %% [markdown]
# ## 9. `save_pretrained` → `AutoModel.from_pretrained`
#
# The folder holds safetensors weights, the config (with `auto_map`) and the model's own code, so it
# loads through the Auto classes, here and on the Hub.

# %%
from transformers import AutoModel, AutoModelForSeq2SeqLM

saved = workdir / "copy-model"
model.save_pretrained(saved)
print(sorted(p.name for p in saved.iterdir()))
reloaded = AutoModelForSeq2SeqLM.from_pretrained(saved).eval()
headless = AutoModel.from_pretrained(saved)
with torch.no_grad():
    same = torch.equal(reloaded(input_ids=source_ids, decoder_input_ids=greedy).logits,
                       model(input_ids=source_ids, decoder_input_ids=greedy).logits)
print(type(reloaded).__name__, "· same logits as before saving:", same, "·", type(headless).__name__)

# %% [markdown]
# ## 10. The explorer
#
# `minitx explore` (here its function) writes one HTML file that any browser opens offline: the tokens,
# every layer's and head's attention (click a token to see where it looks), the next-token predictions
# and the logit lens, and the model. With `--run` and a training folder with checkpoints, a slider goes
# through them next to the loss curve.

# %%
from hf_minitx.tools.explore import explore_data, write_explorer

text = "5 9 7 4 12 6 15 8"
# in the walkthrough's temporary folder, gone when the kernel stops: give a path of your own to keep the page
page = write_explorer(workdir / "copy", text, workdir / "copy-explorer.html", target=text)
print(f"wrote {page} ({page.stat().st_size / 1e3:.0f} kB)")
data = explore_data(workdir / "copy", text, target=text)
print("top next token after each decoder input:", [position[0][0] for position in data["snapshots"][0]["top"]])
