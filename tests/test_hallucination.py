"""Contextual hallucination: QA items and their exact judge, the summary judges, the run and its CLI."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from transformers import LlamaForCausalLM

from difftransformer import DiffTransformerForCausalLM
from difftransformer.cli import main
from difftransformer.data.needles import NeedleSpec
from difftransformer.data.tokenizer import train_tokenizer
from difftransformer.eval import hallucination as H
from difftransformer.eval.generation import greedy_generator, greedy_ids, prompt_tokens
from difftransformer.eval.hallucination.judges import (
    NO_WORDS,
    YES_WORDS,
    EntityJudge,
    ModelJudge,
    extract_entities,
    load_judge,
)
from difftransformer.eval.hallucination.qa import (
    ATTRIBUTES,
    CATEGORIES,
    NAMES,
    QA_TEMPLATE,
    QAItem,
    answer_complete,
    evaluate_qa,
    extract_answer,
    judge_answer,
    make_qa_items,
    max_distractors,
)
from difftransformer.eval.options import to_json
from difftransformer.eval.task import SuiteContext
from difftransformer.storage import read_json

# --- QA items


def sentences(document: str) -> list[str]:
    return re.findall(r"[^.]+\.", document)


def test_vocabularies_are_single_words_and_disjoint():
    pools = [set(NAMES)] + [set(a.values) for a in ATTRIBUTES.values()]
    for pool in pools:
        assert all(re.fullmatch(r"[A-Za-z0-9]+", value) for value in pool)
    lowered = [{v.lower() for v in pool} for pool in pools]
    assert sum(len(p) for p in lowered) == len(set().union(*lowered)), "a word belongs to two pools"


def test_items_place_the_gold_sentence_at_its_depth_among_distractors():
    items = make_qa_items(7, depths=[0.0, 0.5, 1.0], distractors=[0, 2, 5], samples=3)
    assert len(items) == 27
    for item in items:
        said = sentences(item.document)
        assert len(said) == item.sentences == (item.distractors + 1) * len(ATTRIBUTES)
        assert item.position == round(item.depth * (item.sentences - 1))
        gold = ATTRIBUTES[item.attribute].statement.format(name=item.entity, value=item.answer)
        assert said[item.position].strip() == gold
        assert sum(s.strip() == gold for s in said) == 1
        people = {s.split()[0].removesuffix("'s") for s in said}
        assert item.entity in people and len(people) == item.distractors + 1
        # Every person has a distinct value of every kind, all listed in ``values``.
        assert len(set(item.values)) == len(item.values) == item.sentences
        assert all(value in item.document for value in item.values)


def test_items_are_seeded_and_each_cell_is_independent_of_the_others():
    a = make_qa_items(3, depths=[0.25, 1.0], distractors=[1, 4], samples=2)
    assert a == make_qa_items(3, depths=[0.25, 1.0], distractors=[1, 4], samples=2)
    assert a != make_qa_items(4, depths=[0.25, 1.0], distractors=[1, 4], samples=2)
    alone = make_qa_items(3, depths=[1.0], distractors=[4], samples=2)
    assert [i for i in a if (i.distractors, i.depth) == (4, 1.0)] == alone


def test_bad_qa_settings_are_refused_with_the_setting_named():
    with pytest.raises(ValueError, match="`depths` must be"):
        make_qa_items(0, depths=[1.5], distractors=[1], samples=1)
    with pytest.raises(ValueError, match=r"`distractors` must be .* \[0, 15\]"):
        make_qa_items(0, depths=[0.0], distractors=[max_distractors(tuple(ATTRIBUTES)) + 1], samples=1)
    with pytest.raises(ValueError, match="`attributes` must be distinct names"):
        make_qa_items(0, depths=[0.0], distractors=[1], samples=1, attributes=["city", "shoe"])
    with pytest.raises(ValueError, match="`samples` must be >= 1"):
        make_qa_items(0, depths=[0.0], distractors=[1], samples=0)


# --- the exact judge


def oracle(prompt: str) -> str:
    """Answers from the document: finds the statement about the asked person and attribute."""
    document, question = re.fullmatch(r"(.*)\n\nQuestion: (.*)\nAnswer:", prompt, re.S).groups()
    for attribute in ATTRIBUTES.values():
        asked = re.fullmatch(re.escape(attribute.question).replace(r"\{name\}", r"(\w+)"), question)
        if asked:
            pattern = re.escape(attribute.statement).replace(r"\{name\}", asked.group(1))
            return " " + re.search(pattern.replace(r"\{value\}", r"(\w+)"), document).group(1) + ".\nMore"
    raise AssertionError(f"no attribute asks {question!r}")


def test_an_oracle_is_always_correct_and_never_hallucinates():
    items = make_qa_items(1, depths=[0.0, 0.5, 1.0], distractors=[1, 3, 7], samples=4)
    result = evaluate_qa(items, oracle)
    assert result["rates"] == {"correct": 1.0, "hallucination": 0.0, "confusion": 0.0, "other": 0.0}
    assert [c["depth"] for c in result["by_depth"]] == [0.0, 0.5, 1.0]
    assert all(
        c["items"] == 12 and c["correct"] == 1.0 for c in result["by_depth"] + result["by_distractors"]
    )


@pytest.mark.parametrize("fixed", ["blue", "Paris", "zebra", "42"])
def test_a_model_answering_one_fixed_value_scores_what_it_must(fixed):
    items = make_qa_items(
        2, depths=[0.0, 1.0], distractors=[2, 6], samples=10, attributes=["colour", "city", "age"]
    )
    result = evaluate_qa(items, lambda prompt: f" {fixed}")

    def expected(item: QAItem) -> str:
        if fixed == item.answer:
            return "correct"
        if fixed in item.values:
            return "confusion"
        return "hallucination" if fixed.lower() not in item.document.lower() else "other"

    truth = [expected(i) for i in items]
    assert [o["category"] for o in result["outputs"]] == truth
    assert result["rates"] == {c: truth.count(c) / len(truth) for c in CATEGORIES}
    for cell in result["by_distractors"]:
        mine = [t for t, i in zip(truth, items) if i.distractors == cell["distractors"]]
        assert cell["hallucination"] == mine.count("hallucination") / len(mine)
    if fixed == "zebra":
        assert result["rates"]["hallucination"] == 1.0


def planted() -> QAItem:
    document = "Anna lives in Paris. Bruno lives in Rome. Anna works as a baker. Bruno works as a tailor."
    return QAItem(
        document,
        "Where does Anna live?",
        "Paris",
        "Anna",
        "city",
        ("Paris", "Rome", "baker", "tailor"),
        0.0,
        0,
        4,
        1,
    )


@pytest.mark.parametrize(
    "continuation, answer, category",
    [
        (" Paris.", "paris", "correct"),
        (" the Paris of France", "paris", "correct"),
        (" Rome", "rome", "confusion"),  # the distractor's city
        (" a tailor", "tailor", "confusion"),  # a value of another attribute
        (" Tokyo", "tokyo", "hallucination"),  # a city the document never names
        (" Madrid\nParis", "madrid", "hallucination"),  # only the first line counts
        ("\nParis", "", "other"),
        (" Bruno", "bruno", "other"),  # in the document, but no value
        (" Anna's", "anna", "other"),
        ("", "", "other"),
    ],
)
def test_confusions_are_told_apart_from_hallucinations(continuation, answer, category):
    assert extract_answer(continuation) == answer
    assert judge_answer(planted(), answer) == category


@pytest.mark.parametrize(
    "continuation, complete",
    [
        (" Cop", False),
        (" Copenhagen", False),
        (" Copenhagen.", True),
        (" the ", False),
        (" the Rome ", True),
        ("\n", True),
        ("", False),
        (" 4", False),
        (" 42 years", True),
    ],
)
def test_decoding_stops_once_the_answer_word_is_complete(continuation, complete):
    assert answer_complete(continuation) == complete


# --- the summary judges

SOURCE = (
    "Oil falls 6% in mild winter. US oil prices fell by 6% on Monday. Light crude fell $2.86 to $41.32 on "
    "the New York Mercantile Exchange, said analyst Tony Blair's adviser. Shares rose in 2004 and 1,000 jobs "
    "went."
)


def test_entities_are_numbers_and_capitalised_runs():
    text = "The US lost $41.32 in New York. Shares of Acme Corp rose 1,000 times, said Mary's aunt in May."
    assert extract_entities(text) == [
        "US",
        "41.32",
        "New York",
        "Shares",
        "Acme Corp",
        "1,000",
        "Mary",
        "May",
    ]
    # A sentence's first word is a name only when the texts never use it in lower case.
    assert extract_entities(text, {"shares"}) == [
        "US",
        "41.32",
        "New York",
        "Acme Corp",
        "1,000",
        "Mary",
        "May",
    ]


@pytest.mark.parametrize(
    "summary, unsupported, entities",
    [
        ("US oil prices fell 6% on the New York exchange.", [], ["US", "6", "New York"]),
        (
            "Oil fell to $40 as Gordon Brown spoke in New York.",
            ["40", "Gordon Brown"],
            ["40", "Gordon Brown", "New York"],
        ),
        ("Blair's adviser saw 1000 jobs go in 2004.", [], ["Blair", "1000", "2004"]),
        (
            "Crude fell $2.86 at the York Exchange in 2005.",
            ["York Exchange", "2005"],
            ["2.86", "York Exchange", "2005"],
        ),
        ("prices fell.", [], []),
    ],
)
def test_the_entity_judge_on_hand_made_summaries(summary, unsupported, entities):
    judgment = EntityJudge()(SOURCE, summary)
    assert judgment.details["entities"] == entities
    assert judgment.details["unsupported"] == unsupported
    assert judgment.details["rate"] == (len(unsupported) / len(entities) if entities else None)
    assert judgment.free == (not unsupported)


def test_the_entity_judge_aggregates_over_all_entities():
    judge = EntityJudge()
    judgments = [
        judge(SOURCE, s) for s in ("US oil fell 6%.", "Gordon Brown and Tony Blair met.", "", "it fell.")
    ]
    numbers = judge.aggregate(judgments)
    # 2 + 2 entities, 1 unsupported (Gordon Brown); the empty summary is not free.
    assert numbers == dict(free=0.5, entity_hallucination_rate=1 / 4, entities=4, without_entities=0.5)


class FixedLogits(nn.Module):
    """A 'judge model' whose next token is always ``favourite`` (most of the probability)."""

    def __init__(self, vocab: int, favourite: int, max_positions: int = 4096):
        super().__init__()
        self.vocab, self.favourite = vocab, favourite
        self.config = SimpleNamespace(max_position_embeddings=max_positions)

    def forward(self, input_ids, use_cache=False):
        logits = torch.zeros(1, input_ids.shape[1], self.vocab)
        logits[..., self.favourite] = 10.0
        return SimpleNamespace(logits=logits)


@pytest.fixture(scope="module")
def tokenizer():
    words = " ".join(["Yes", "No", "yes", "no", "Answer", "Document", "Text"] + list(NAMES))
    texts = [words, "The magic number of Paris is 123. Anna lives in Rome and keeps a cat."] * 4
    return train_tokenizer(texts, vocab_size=320)


def test_the_model_judge_reads_yes_and_no_from_the_next_token(tokenizer):
    first = tokenizer("Yes", add_special_tokens=False)["input_ids"][0]
    says_yes = ModelJudge(FixedLogits(len(tokenizer), first), tokenizer, name="yes-sayer")
    judgment = says_yes(SOURCE, "US oil fell.")
    assert judgment.free and judgment.details["p_yes"] > 0.99 and judgment.details["mass"] > 0.5
    no_id = tokenizer(" No", add_special_tokens=False)["input_ids"][0]
    says_no = ModelJudge(FixedLogits(len(tokenizer), no_id), tokenizer)
    assert not says_no(SOURCE, "US oil fell.").free
    assert set(says_no.yes_ids).isdisjoint(says_no.no_ids)
    with pytest.raises(ValueError, match="prompt tokens"):
        ModelJudge(FixedLogits(len(tokenizer), first, max_positions=8), tokenizer).check([SOURCE], 4)


def save_tiny(model: nn.Module, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_model(model_class: type, tokenizer, heads: int, max_positions: int) -> nn.Module:
    """A 2-layer model of ``model_class`` (seeded) sized for ``tokenizer``, with its special tokens."""
    torch.manual_seed(0)
    config = model_class.config_class(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model_class(config).eval()


def tiny_llama(tokenizer, max_positions: int = 2048) -> LlamaForCausalLM:
    return tiny_model(LlamaForCausalLM, tokenizer, heads=4, max_positions=max_positions)


def tiny_diff(tokenizer, max_positions: int = 2048) -> DiffTransformerForCausalLM:
    return tiny_model(DiffTransformerForCausalLM, tokenizer, heads=2, max_positions=max_positions)


@pytest.mark.parametrize("chat", [False, True])
def test_a_tiny_random_judge_model_runs_end_to_end(tokenizer, tmp_path, chat):
    judge_tokenizer = train_tokenizer([" ".join(YES_WORDS + NO_WORDS), SOURCE] * 3, vocab_size=300)
    if chat:
        judge_tokenizer.chat_template = (
            "{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}<bot>"
        )
    path = save_tiny(tiny_llama(judge_tokenizer), judge_tokenizer, tmp_path / "judge")
    judge = load_judge(str(path))
    assert isinstance(judge, ModelJudge) and judge.name == str(path)
    assert judge_tokenizer.decode(judge.prompt_ids(SOURCE, "US oil fell.")).endswith(
        "<bot>" if chat else "Answer Yes or No.\nAnswer:"
    )
    judgments = [judge(SOURCE, summary) for summary in ("US oil fell 6%.", "Nothing happened in Paris.")]
    for j in judgments:
        assert 0.0 < j.details["p_yes"] < 1.0 and 0.0 < j.details["mass"] <= 1.0
        assert j.free == (j.details["p_yes"] > 0.5)
    numbers = judge.aggregate(judgments)
    assert numbers["free"] == np.mean([j.free for j in judgments])
    assert numbers["mean_p_yes"] == pytest.approx(np.mean([j.details["p_yes"] for j in judgments]))


def test_a_judge_must_be_entities_or_a_model_directory(tmp_path):
    with pytest.raises(ValueError, match="`judge` must be 'entities' or a local model directory"):
        load_judge(str(tmp_path / "missing"))
    assert isinstance(load_judge("entities"), EntityJudge)


# --- the run


def test_greedy_generation_is_cut_at_the_first_newline_and_stops_when_done(tokenizer):
    model = tiny_llama(tokenizer)
    prompt = "Anna lives in Rome.\n\nQuestion: Where does Anna live?\nAnswer:"
    ids = tokenizer(prompt, return_tensors="pt")
    plain = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(plain[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert greedy_generator(model, tokenizer, 12)(prompt) == text.split("\n", 1)[0]
    one_token = greedy_generator(model, tokenizer, 1)(prompt)
    assert greedy_generator(model, tokenizer, 12, done=lambda new: True)(prompt) == one_token
    # The same tokens as transformers' greedy generate, EOS and all, on a DIFF model too.
    diff = tiny_diff(tokenizer)
    plain = diff.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    prompt_ids = ids["input_ids"][0].tolist()
    assert (
        greedy_ids(diff, prompt_ids, 12, eos_token_id=tokenizer.eos_token_id)
        == plain[0, len(prompt_ids) :].tolist()
    )


def test_summaries_are_judged_and_documents_cut_to_fit(tokenizer):
    documents = [SOURCE + " " + SOURCE, "Anna lives in Rome. " * 30]
    fitted = H.fit_document(
        tokenizer, documents[1], words=1000, template=H.SUMMARY_TEMPLATE, context_length=64, max_new_tokens=8
    )
    length = prompt_tokens(tokenizer, H.SUMMARY_TEMPLATE.format(document=fitted))
    longer = H.cut_words(documents[1], len(fitted.split()) + 1)
    assert length + 8 <= 64 < prompt_tokens(tokenizer, H.SUMMARY_TEMPLATE.format(document=longer)) + 8
    result = H.evaluate_summaries(documents, lambda prompt: " US oil fell 6% in Paris", EntityJudge())
    assert [o["unsupported"] for o in result["outputs"]] == [["Paris"], ["US", "6", "Paris"]]
    assert (
        result["free"] == 0.0
        and result["entity_hallucination_rate"] == 4 / 6
        and result["judge"] == "entities"
    )


def test_prompts_too_long_for_the_model_are_refused_before_generating(tokenizer):
    model = tiny_diff(tokenizer, max_positions=64)
    qa = H.HallucinationOptions(families=["qa"], distractors=[7], samples=1)
    with pytest.raises(
        ValueError, match=r"the longest QA prompt \(\d+ tokens with `distractors` 7\) and `qa_max"
    ):
        H.run_hallucination(model, tokenizer, qa, progress=False)
    # A token budget alone beyond the context names its own field (it named `distractors` once).
    budget = H.HallucinationOptions(families=["qa"], distractors=[0], samples=1, qa_max_new_tokens=100_000)
    with pytest.raises(
        ValueError, match="`qa_max_new_tokens` 100000: .* exceeds the model's max_position_emb"
    ):
        H.run_hallucination(model, tokenizer, budget, progress=False)
    summary = H.HallucinationOptions(families=["summary"])
    with pytest.raises(ValueError, match=r"`article_words` 300\) and `summary_max_new_tokens` 64"):
        H.run_hallucination(model, tokenizer, summary, texts=[SOURCE * 3], progress=False)
    with pytest.raises(ValueError, match="`families` must be distinct names"):
        H.HallucinationOptions(families=["qa", "poems"])
    with pytest.raises(ValueError, match="`judge_dtype` must be a torch dtype name"):
        H.HallucinationOptions(judge_dtype="float33")


def test_light_options_fit_the_context_and_run_on_held_out_texts(tokenizer, tmp_path):
    light = H.TASK.light_settings(distractors=(1, 3, 15), documents="held_out", summaries=2, samples=1)
    items = make_qa_items(5, depths=light.depths, distractors=[3], samples=1, attributes=light.attributes)
    longest = max(
        prompt_tokens(tokenizer, QA_TEMPLATE.format(document=i.document, question=i.question)) for i in items
    )
    context = longest + light.qa_max_new_tokens  # 3 distractors just fit, 15 cannot
    suite = SuiteContext(
        context_length=context,
        needle=NeedleSpec(needle_digits=3),
        needles=((1, 1),),
        seed=5,
        tokenizer=tokenizer,
        held_out_tokens=10_000,
    )
    options = H.TASK.light_options(light, suite)
    assert options.distractors == [1, 3] and options.fit_context == context
    narrower = H.TASK.light_options(light, dataclasses.replace(suite, context_length=context - 1))
    assert narrower.distractors == [1]
    model = tiny_diff(tokenizer, max_positions=context)
    texts = [SOURCE * 4, "Anna lives in Rome and keeps a cat. " * 20, "Bruno sings."]
    results = H.TASK.run(model, tokenizer, texts, options, tmp_path, progress=False)
    assert len(results["qa"]["outputs"]) == 2 * 3 and len(results["summary"]["outputs"]) == 2
    assert (tmp_path / "hallucination.json").is_file() and (tmp_path / "hallucination.png").is_file()
    summary = H.TASK.summarise(results)
    headers = [c.header for c in H.TASK.columns(summary)]
    assert headers[:4] == ["QA correct", "QA hallucination", "QA confusion", "summaries judged free"]
    assert all(name in headers for panel in H.TASK.chart(summary).panels for name in panel.columns)
    values = {m.name: m.value(summary) for m in H.TASK.measures(summary)}
    assert values["contextual QA hallucination rate"] == summary["qa"]["hallucination"]
    assert "XSum 0.44 / 0.53" in H.TASK.describe(
        to_json(options)
    ) and "Qasper 0.28 / 0.39" in H.TASK.describe(to_json(options))
    vacuous = H.TASK.columns({"summary": {"free": 1.0, "unsupported_entities": None}})
    assert [(c.header, c.value) for c in vacuous] == [
        ("summaries judged free", 1.0),
        ("unsupported entities", 0.0),
    ]
    with pytest.raises(ValueError, match="no QA document"):
        H.TASK.light_options(H.TASK.light_settings(distractors=(15,)), suite)


# --- the command line


@pytest.fixture(scope="module")
def checkpoints(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("hallucination")
    paths = {
        "difftransformer": save_tiny(tiny_diff(tokenizer), tokenizer, root / "diff"),
        "llama": save_tiny(tiny_llama(tokenizer), tokenizer, root / "llama"),
    }
    for number, text in enumerate([SOURCE, "Anna lives in Rome and keeps a cat. Bruno sings in Paris. " * 5]):
        (root / f"doc{number}.txt").write_text(text)
    return paths, [root / "doc0.txt", root / "doc1.txt"]


QUICK = "--depths 0,1 --distractors 1,2 --samples 2 --attributes city,colour --summary-max-new-tokens 12"


@pytest.mark.parametrize("family", ["difftransformer", "llama"])
def test_the_cli_runs_both_families(checkpoints, tmp_path, family, capsys):
    paths, documents = checkpoints
    argv = [
        "eval",
        "hallucination",
        "--model",
        str(paths[family]),
        "--output-dir",
        str(tmp_path),
        "--no-progress",
    ]
    argv += [*QUICK.split(), "--documents", str(documents[0]), "--documents", str(documents[1])]
    if family == "llama":
        argv += ["--judge", str(paths["difftransformer"])]
    assert main(argv) == 0
    assert "hallucination: {'qa': {'correct'" in capsys.readouterr().out
    results = read_json(tmp_path / "hallucination.json")
    assert results["families"] == ["qa", "summary"] and (tmp_path / "hallucination.png").is_file()
    assert len(results["qa"]["outputs"]) == 2 * 2 * 2
    assert [c["distractors"] for c in results["qa"]["by_distractors"]] == [1, 2]
    assert sum(results["qa"]["rates"].values()) == pytest.approx(1.0)
    assert len(results["summary"]["outputs"]) == 2
    judge = "entities" if family == "difftransformer" else str(paths["difftransformer"])
    assert results["summary"]["judge"] == judge
    assert ("mean_p_yes" in results["summary"]) == (family == "llama")


def test_the_cli_is_seeded_and_checks_its_flags_first(checkpoints, tmp_path, capsys):
    paths, documents = checkpoints
    runs = []
    for out in ("a", "b"):
        argv = [
            "eval",
            "hallucination",
            "--model",
            str(paths["llama"]),
            "--output-dir",
            str(tmp_path / out),
            "--no-progress",
            "--families",
            "qa",
            *QUICK.split(),
        ]
        main(argv)
        runs.append(read_json(tmp_path / out / "hallucination.json"))
    assert runs[0] == runs[1]
    base = ["eval", "hallucination", "--model", str(paths["llama"]), "--output-dir", str(tmp_path / "c")]
    for flags, message in (
        (["--judge", str(tmp_path)], "--judge must be 'entities' or a local model directory"),
        (["--judge-dtype", "float33"], "--judge-dtype must be a torch dtype name"),
        (["--seed", "-1"], "--seed must lie in [0, 2**32 - 1]"),
        (["--qa-max-new-tokens", "100000"], "--qa-max-new-tokens 100000: "),
        (["--qa-template", "{document} Q:"], "--qa-template must contain {question}"),
        (["--documents", str(tmp_path / "none.txt")], "does not exist"),
        (["--summaries", "0"], "--summaries must be >= 1"),
        (["--families", "qa", "--depths", "2"], "--depths must be"),
    ):
        assert main(base + flags) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
