import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("default", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def data():
    """(tokenizer, training blocks, 8 validation blocks) of the synthetic corpus of ``test_train_support``, its
    ``BLOCK`` tokens each: what the training tests train on."""
    from test_train_support import BLOCK, pack, small_tokenizer, synthetic_texts

    texts = synthetic_texts()
    tokenizer = small_tokenizer(texts)
    blocks = pack(texts, tokenizer, BLOCK)
    return tokenizer, blocks[:-8], blocks[-8:]
