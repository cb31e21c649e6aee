"""Data at scale: the packed blocks of the built-in corpus stay byte-identical, files are streamed (parquet
included), tokenised in parallel into a memory-mapped cache, and ranks read disjoint shares."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from difftransformer.data import (
    CorpusError,
    DataOptions,
    FileCorpus,
    load_corpus,
    open_corpus,
    packed_blocks,
    train_tokenizer,
)
from difftransformer.data import blocks as blocks_module
from difftransformer.data import cli as prepare_cli
from difftransformer.data.corpus import split_documents
from difftransformer.train.pipeline import prepare_data

# sha256 of the int64 bytes of each split's blocks (block size 256), as packed before the blocks were streamed
# and memory-mapped: the study's and the demo's data must not move.
BUILTIN_BLOCKS = {
    320: {
        "train": ((12270, 256), "fef5c1987ca56acad35feb4821471b866cb58dc9c7690f46d07421b8882aeee8"),
        "validation": ((621, 256), "ce0dc8a918ce4df8d1ad398d2d0ac5f0c781bce787161b98df649769837f296f"),
        "test": ((605, 256), "fc56511a69f381975a22d7dcb175290bd8449705c01a682126660b14ca839763"),
    },
    4096: {
        "train": ((5855, 256), "7c8f0dbf1ed1c3fcf5212b65a1c810425e8bfdde4c93943c16b4ad47d4fe520e"),
        "validation": ((308, 256), "7d7bb58c4b58aadf7e852766bed1e99e15e5d833f6156c4ce6940d9583a5c7ab"),
        "test": ((304, 256), "b0aca323cd7433d9ee66372632fbe0fb69c16423aadf2ae874295d568415a95b"),
    },
}


@pytest.mark.parametrize("vocab_size", sorted(BUILTIN_BLOCKS))
def test_builtin_corpus_blocks_are_unchanged(vocab_size, tmp_path):
    corpus = load_corpus(None)
    tokenizer = train_tokenizer(corpus.train, vocab_size)
    for split, (shape, digest) in BUILTIN_BLOCKS[vocab_size].items():
        blocks = packed_blocks(getattr(corpus, split), tokenizer, 256, cache_dir=tmp_path)
        assert tuple(blocks.shape) == shape
        assert hashlib.sha256(blocks.numpy().tobytes()).hexdigest() == digest, split


def _documents(n: int) -> list[str]:
    return [f"Record {i}: {'lorem ipsum ' * (1 + i % 7)}number {i * 7919 % 1000}.\n" for i in range(n)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(_documents(200), vocab_size=300)


def test_streamed_split_equals_the_in_memory_split(tmp_path):
    docs = _documents(120)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:70]))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[70:]))
    corpus = open_corpus([str(tmp_path / "*.jsonl")], seed=5, validation_fraction=0.1, test_fraction=0.2)
    assert isinstance(corpus, FileCorpus) and corpus.count == 120
    expected = split_documents(corpus.name, docs, seed=5, validation_fraction=0.1, test_fraction=0.2)
    for split in ("train", "validation", "test"):
        assert list(corpus.documents(split)) == getattr(expected, split)
    assert (
        load_corpus([str(tmp_path / "*.jsonl")], seed=5, validation_fraction=0.1, test_fraction=0.2)
        == expected
    )
    with pytest.raises(ValueError, match="split must be one of"):
        next(corpus.documents("dev"))


def test_parquet_files_are_read(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    docs = _documents(3000)
    pq.write_table(
        pa.table({"id": list(range(3000)), "body": docs}), tmp_path / "part.parquet", row_group_size=700
    )
    (tmp_path / "more.txt").write_text("a text file beside it\n")
    corpus = load_corpus([str(tmp_path)], text_field="body")
    assert sorted(corpus.train + corpus.validation + corpus.test) == sorted(
        [*docs, "a text file beside it\n"]
    )
    assert load_corpus([str(tmp_path)], text_field="body") == corpus
    with pytest.raises(
        CorpusError, match=r"part\.parquet: expected a 'text' column, got columns \['id', 'body'\]"
    ):
        load_corpus([str(tmp_path / "part.parquet")])
    with pytest.raises(CorpusError, match=r"part\.parquet: column 'id' should hold strings, got int64"):
        load_corpus([str(tmp_path / "part.parquet")], text_field="id")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(CorpusError, match=r"broken\.parquet is not a readable parquet file"):
        load_corpus([str(tmp_path / "broken.parquet")])


def test_parallel_tokenising_gives_the_serial_blocks(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(blocks_module, "_BATCH_CHARACTERS", 5000)  # many batches, several per worker
    docs = _documents(3000)
    serial = packed_blocks(docs, tokenizer, 64, cache_dir=tmp_path / "one", num_proc=1)
    parallel = packed_blocks(lambda: iter(docs), tokenizer, 64, cache_dir=tmp_path / "two", num_proc=3)
    stream = []
    for doc in docs:
        stream += tokenizer(doc)["input_ids"] + [tokenizer.eos_token_id]
    assert torch.equal(serial, parallel)
    assert serial.flatten().tolist() == stream[: serial.numel()]
    # The blocks view the cache file memory-mapped; writing to them never changes the file.
    parallel[0, 0] = -1
    assert packed_blocks(docs, tokenizer, 64, cache_dir=tmp_path / "two")[0, 0] == stream[0]
    with pytest.raises(ValueError, match="`num_proc` must be a positive integer, got 0"):
        packed_blocks(["other text"] * 50, tokenizer, 8, cache_dir=tmp_path, num_proc=0)


def test_tokenising_workers_are_born_with_sigterm_at_its_default(tokenizer, tmp_path, monkeypatch):
    """A forked worker inherits its parent's Python SIGTERM handler; one that returns (a Ray driver's, which
    compare holds while it runs) swallows Pool.terminate's signal to a worker still starting up, and the pool's
    join waits on it forever. Each worker records the handler it was born with, before its own start-up code."""
    start = blocks_module._start_worker

    def recording_start(*args):
        (tmp_path / f"worker-{os.getpid()}").write_text(
            str(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
        )
        start(*args)

    def own(*_):
        return None

    monkeypatch.setattr(blocks_module, "_start_worker", recording_start)
    previous = signal.signal(signal.SIGTERM, own)
    try:
        blocks = packed_blocks(_documents(300), tokenizer, 64, cache_dir=tmp_path / "cache", num_proc=2)
        assert signal.getsignal(signal.SIGTERM) is own  # the parent's handler is back
    finally:
        signal.signal(signal.SIGTERM, previous)
    born = [path.read_text() for path in tmp_path.glob("worker-*")]
    assert blocks.shape[1] == 64 and born == ["True", "True"], born


def test_prepare_then_train_data_reuses_the_cache(tokenizer, tmp_path, monkeypatch):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in _documents(400)))
    tokenizer.save_pretrained(tmp_path / "tok")
    parser = argparse.ArgumentParser()
    prepare_cli.configure(parser)
    args = parser.parse_args(
        ["--data", str(tmp_path / "d.jsonl"), "--tokenizer", str(tmp_path / "tok"), "--block-size", "32"]
        + ["--cache-dir", str(tmp_path / "cache"), "--output-dir", str(tmp_path / "out"), "--num-proc", "2"]
    )
    assert prepare_cli.run(args) == 0

    def no_tokenising(*args, **kwargs):
        raise AssertionError("re-tokenised although prepare cached these blocks")

    monkeypatch.setattr(blocks_module, "tokenize_documents", no_tokenising)
    options = DataOptions(
        data=[str(tmp_path / "d.jsonl")], tokenizer=str(tmp_path / "tok"), cache_dir=str(tmp_path / "cache")
    )
    data = prepare_data(options=options, vocab_size=300, block_size=32)
    assert data.train_blocks.dtype == torch.int64 and data.train_blocks.shape[1] == 32
    assert len(data.test_texts) == 20 and all(isinstance(t, str) for t in data.test_texts)


RANKS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from difftransformer.data import load_tokenizer, packed_blocks
    from difftransformer.train.runner import Blocks, LanguageModelTrainer
    from difftransformer.train.presets import get_preset
    from difftransformer.models import DiffTransformerForCausalLM
    from difftransformer.train.settings import TrainingSettings
    from transformers import default_data_collator

    out, tok, cache = sys.argv[1:4]
    tokenizer = load_tokenizer(tok)
    docs = [f"Record {i}: " + "lorem ipsum " * (1 + i % 7) for i in range(400)]
    blocks = packed_blocks(docs, tokenizer, 16, cache_dir=cache)
    served = []

    class Recorded(Blocks):
        def __getitem__(self, index):
            served.append(int(index))
            return super().__getitem__(index)

    config = get_preset("micro").model_config("diff", vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    args = TrainingSettings(output_dir=out, per_device_train_batch_size=4, max_steps=3, report_to="none", seed=0,
                             eval_strategy="no")
    trainer = LanguageModelTrainer(model=DiffTransformerForCausalLM(config), args=args,
                                   train_dataset=Recorded(blocks, config.vocab_size), data_collator=default_data_collator)
    loader = trainer.get_train_dataloader()
    for step, _ in zip(range(3), loader):
        pass
    with open(f"{out}/rank{args.process_index}.json", "w") as f:
        json.dump({"served": served, "world": args.world_size, "rows": int(blocks.shape[0])}, f)
    """
)


@pytest.mark.slow
def test_ranks_read_disjoint_shares(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "tok")
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}"]
    command += [str(script), str(tmp_path), str(tmp_path / "tok"), str(tmp_path / "cache")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world"] == 2 for r in ranks)
    first, second = (set(r["served"]) for r in ranks)
    # 3 steps of 4 blocks each, and the batch accelerate's loader fetches ahead
    assert len(first) == len(second) and len(first) in (12, 16)
    assert not first & second
    assert max(first | second) < ranks[0]["rows"]
