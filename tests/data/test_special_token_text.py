"""Special tokens come only from the pipeline, never from the text: a literal "<eos>", "<pad>", "<bos>" or
"<unk>" in a document, a prompt or a source is encoded as text and round-trips, whichever way the tokenizer was
made or loaded, and packed training blocks hold EOS only at document ends."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_minitx import MiniTxConfig, MiniTxForCausalLM
from hf_minitx.cli import main as minitx
from hf_minitx.data import PackedBlockStream, preprocess_seq2seq, tokenize_and_pack, train_bpe_tokenizer
from hf_minitx.data.tokenizer import SPECIAL_TOKENS, load_tokenizer
from hf_minitx.tools.model_reading import encode_text

REPO = Path(__file__).resolve().parents[2]
SPECIAL_IDS = set(range(len(SPECIAL_TOKENS)))  # <pad>, <bos>, <eos>, <unk>
EOS, PAD = 2, 0
TEXTS = [f"The {w} said unto {v}, Let there be light; and there was {w} {i}." for i, (w, v) in
         enumerate([("LORD", "Moses"), ("king", "Aaron"), ("prophet", "David")] * 30)]
SPECIAL_TEXTS = [
    "Some text <eos> more <pad>", "<eos>", "<bos>", "<pad>", "<unk>", "<eos><eos><pad><bos><unk>",
    "a<eos>b<pad>c<bos>d<unk>e", "<bos> a whole document <eos>", "html <p>x</p> <eos/> </eos> < eos >",
    "chat log:\nuser: hi<eos>\n\tbot: <pad><pad> bye <unk>\n",
]


@pytest.fixture(autouse=True)
def isolated_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "special_cache"))


def old_style(folder: Path) -> Path:
    """``folder`` as tokenizers were saved before special-token text was kept as text (no flag in the config)."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.pop("split_special_tokens", None)
    path.write_text(json.dumps(config, indent=2))
    return folder


@pytest.fixture(scope="module")
def trained():
    return train_bpe_tokenizer(TEXTS + SPECIAL_TEXTS, vocab_size=320)


@pytest.fixture(scope="module")
def old_folder(trained, tmp_path_factory):
    folder = tmp_path_factory.mktemp("old") / "tokenizer"
    trained.save_pretrained(folder)
    return old_style(folder)


@pytest.fixture
def plain_old(old_folder):
    """An old-style folder loaded as a Python user might, with the flag off: the pipeline must not rely on it."""
    tokenizer = AutoTokenizer.from_pretrained(old_folder)
    assert tokenizer("<eos>")["input_ids"] == [EOS]  # the old behaviour, which the pipeline must not inherit
    return tokenizer


def assert_text_only(tokenizer, text: str, name: str = "") -> None:
    ids = tokenizer(text)["input_ids"]
    assert not SPECIAL_IDS & set(ids), (name, text, ids)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_special_token_text_stays_text_however_the_tokenizer_is_made_or_loaded(trained, old_folder, tmp_path):
    trained.save_pretrained(tmp_path / "new")
    repo_copy = old_style(Path(shutil.copytree(REPO / "tokenizer", tmp_path / "repo_old")))
    load_tokenizer(old_folder).save_pretrained(tmp_path / "resaved")  # an old folder through the loader, saved
    tokenizers = {
        "shipped": AutoTokenizer.from_pretrained(REPO / "tokenizer"),
        "shipped, loader": load_tokenizer(REPO / "tokenizer"),
        "trained": trained,
        "saved, loader": load_tokenizer(tmp_path / "new"),
        "saved, AutoTokenizer": AutoTokenizer.from_pretrained(tmp_path / "new"),
        "old, loader": load_tokenizer(old_folder),
        "old shipped, loader": load_tokenizer(repo_copy),
        "old resaved, AutoTokenizer": AutoTokenizer.from_pretrained(tmp_path / "resaved"),
    }
    for name, tokenizer in tokenizers.items():
        for text in SPECIAL_TEXTS:
            assert_text_only(tokenizer, text, name)
    assert json.loads((tmp_path / "resaved" / "tokenizer_config.json").read_text())["split_special_tokens"] is True


def test_the_shipped_tokenizer_carries_the_flag_and_its_ids_for_normal_text_are_unchanged():
    assert json.loads((REPO / "tokenizer" / "tokenizer_config.json").read_text())["split_special_tokens"] is True
    verse = "In the beginning God created the heaven and the earth."
    old = AutoTokenizer.from_pretrained(REPO / "tokenizer", split_special_tokens=False)
    assert AutoTokenizer.from_pretrained(REPO / "tokenizer")(verse)["input_ids"] == old(verse)["input_ids"]


def test_padding_and_added_eos_are_the_only_special_ids(tmp_path):
    tokenizer = train_bpe_tokenizer(TEXTS, vocab_size=300, add_eos_token=True)
    tokenizer.save_pretrained(tmp_path)
    tokenizer = load_tokenizer(old_style(tmp_path))
    batch = tokenizer(SPECIAL_TEXTS, padding=True)
    for ids, mask, text in zip(batch["input_ids"], batch["attention_mask"], SPECIAL_TEXTS, strict=True):
        body = [i for i, m in zip(ids, mask, strict=True) if m]
        assert [i for i, m in zip(ids, mask, strict=True) if not m] == [PAD] * (len(ids) - len(body))
        assert body[-1] == EOS and not SPECIAL_IDS & set(body[:-1])  # the post-processor's EOS, by id
        assert tokenizer.decode(body, skip_special_tokens=True) == text
    target = tokenizer(text="x <eos> y", text_target="<pad> z")["labels"]
    assert target[-1] == EOS and not SPECIAL_IDS & set(target[:-1])


def test_packed_training_blocks_hold_eos_only_at_document_ends(plain_old):
    docs = [*SPECIAL_TEXTS, "a last ordinary document"]
    dd = datasets.DatasetDict(validation=datasets.Dataset.from_dict({"text": docs}))
    (block,) = tokenize_and_pack(dd, plain_old, block_size=1024, for_evaluation=True)["validation"]["input_ids"]
    bodies = [plain_old(doc, add_special_tokens=False, split_special_tokens=True)["input_ids"] for doc in docs]
    stream = [EOS] + [i for body in bodies for i in [*body, EOS]]  # evaluation streams start with EOS
    assert block == stream + [PAD] * (1024 - len(stream))  # no pad id but the last block's right padding
    assert [plain_old.decode(body) for body in bodies] == docs

    train = datasets.DatasetDict(train=datasets.Dataset.from_dict({"text": docs * 20}))
    blocks = np.array(tokenize_and_pack(train, plain_old, block_size=16)["train"]["input_ids"]).ravel().tolist()
    assert blocks == ([i for body in bodies for i in [*body, EOS]] * 20)[: len(blocks)]
    assert PAD not in blocks and blocks.count(EOS) >= len(blocks) // 40


def test_streamed_blocks_hold_eos_only_at_document_ends(plain_old):
    docs = SPECIAL_TEXTS * 5
    rows = datasets.Dataset.from_dict({"text": docs}).to_iterable_dataset()
    stream = PackedBlockStream(rows, plain_old, 16, shuffle_buffer=0)
    blocks = [block.tolist() for _, block in zip(range(10), stream, strict=False)]
    flat = [i for block in blocks for i in block]
    expected = [i for doc in docs for i in [*plain_old(doc, split_special_tokens=True)["input_ids"], EOS]]
    assert flat == expected[: len(flat)] and PAD not in flat


def test_seq2seq_sources_and_labels_end_with_the_only_eos(tmp_path):
    tokenizer = train_bpe_tokenizer(TEXTS, vocab_size=300, add_eos_token=True)
    tokenizer.save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(old_style(tmp_path))  # the flag off: preprocessing sets it per call
    dd = datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"source": SPECIAL_TEXTS, "target": SPECIAL_TEXTS[::-1]}))
    rows = preprocess_seq2seq(dd, tokenizer, max_source_length=256, max_target_length=256)["train"]
    for row in rows:
        for ids in (row["input_ids"], row["labels"]):
            assert ids[-1] == EOS and not SPECIAL_IDS & set(ids[:-1])


def test_explore_text_is_encoded_as_text(plain_old):
    config = MiniTxConfig(vocab_size=len(plain_old))
    ids = encode_text("look: <eos> and <pad>", plain_old, config)
    assert not SPECIAL_IDS & set(ids) and plain_old.decode(ids) == "look: <eos> and <pad>"


def test_generate_feeds_a_prompt_holding_eos_as_text(old_folder, tmp_path, monkeypatch, capsys):
    folder = Path(shutil.copytree(old_folder, tmp_path / "model"))  # a model folder saved before the change
    torch.manual_seed(0)
    tokenizer = load_tokenizer(old_folder)
    MiniTxForCausalLM(MiniTxConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)).save_pretrained(folder)
    seen = []
    original = MiniTxForCausalLM.generate

    def spy(self, *args, **kwargs):
        seen.append(kwargs["input_ids"][0].tolist())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MiniTxForCausalLM, "generate", spy)
    prompt = "text with <eos> inside <pad>"
    assert minitx(["generate", "--model", str(folder), "--prompt", prompt, "--max_new_tokens", "2"]) in (0, None)
    assert seen == [tokenizer(prompt)["input_ids"]] and not SPECIAL_IDS & set(seen[0])
    assert capsys.readouterr().out.startswith(prompt)


def bpe_without_special_tokens(folder: Path) -> Path:
    """A stock byte-level BPE folder that defines no special token at all."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(folder)
    return folder


def test_train_with_a_tokenizer_without_eos_says_so_before_any_work(tmp_path, monkeypatch, capsys):
    import hf_minitx.training.prepare as prepare

    def never(*args, **kwargs):
        raise AssertionError("the corpus was read before the tokenizer was checked")

    monkeypatch.setattr(prepare, "load_corpus", never)
    folder = bpe_without_special_tokens(tmp_path / "bpe")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS))
    out = tmp_path / "run"
    assert minitx(["train", "--dataset", str(corpus), "--tokenizer", str(folder), "--output_dir", str(out),
                   "--preset", "tiny", "--max_steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --tokenizer {folder} has no EOS, pad or BOS token (minitx needs <pad>, <bos> and <eos>); "
                   "use a tokenizer made by minitx train-tokenizer, or leave --tokenizer out to train one"]
    assert not out.exists()


def test_a_model_trained_with_an_old_tokenizer_folder_saves_the_safe_one(old_folder, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"{text} {special}" for text in TEXTS for special in SPECIAL_TEXTS[:3]))
    out = tmp_path / "run"
    assert minitx(["train", "--dataset", str(corpus), "--tokenizer", str(old_folder), "--output_dir", str(out),
                   "--preset", "tiny", "--config_overrides", "hidden_size=32,intermediate_size=64",
                   "--block_size", "32", "--max_steps", "1", "--eval_steps", "0", "--max_eval_samples", "2",
                   "--num_sample_generations", "1", "--disable_tqdm", "--num_threads", "1"]) in (0, None)
    assert json.loads((out / "tokenizer_config.json").read_text())["split_special_tokens"] is True
    for tokenizer in (PreTrainedTokenizerFast.from_pretrained(out),
                      AutoTokenizer.from_pretrained(out, trust_remote_code=True)):
        for text in SPECIAL_TEXTS:
            assert_text_only(tokenizer, text)
