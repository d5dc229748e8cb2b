"""The RULER tasks' samples: the same samples from the same seed, sized to the length with any tokenizer (byte-level
and a trained BPE), the expected answers really the answers (needles present and asked, the chain's variables, the
ten most frequent words), needles at varied depths, a corpus repeated when short, one error for a length too short."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from hybrid_attention.data.ruler import TASKS, Haystack, TooShort, ruler_samples
from hybrid_attention.data.tokenizer import byte_tokenizer, train_bpe_tokenizer

CORPUS = Haystack([f"line {i}: the quick brown fox jumps over the lazy dog, number {i * 7}\n" for i in range(400)],
                  "test lines")


def _counter(tok):
    def count(text: str) -> int:
        return 1 + len(tok(text, add_special_tokens=False)["input_ids"])

    return count


BYTES = _counter(byte_tokenizer())


@pytest.fixture(scope="module")
def bpe_count():
    texts = [" ".join(CORPUS.lines[:200]), "The grass is green. The sky is blue. special magic numbers VAR = " * 20]
    return _counter(train_bpe_tokenizer(texts * 5, 400))


@pytest.mark.parametrize("name", list(TASKS))
def test_samples_fill_the_length_and_are_reproducible(name, bpe_count):
    for count, length in ((BYTES, 2048), (bpe_count, 2048)):
        samples = ruler_samples(name, length, 3, count, CORPUS, seed=5)
        for s in samples:
            assert count(s.text) == s.prompt_tokens
            assert s.prompt_tokens + s.max_new_tokens <= length
            # one more haystack unit would not fit: the prompt is as long as the length allows, within a unit
            assert s.prompt_tokens + s.max_new_tokens > 0.8 * length, (s.prompt_tokens, s.max_new_tokens, length)
            assert s.answers and all(isinstance(a, str) and a for a in s.answers)
        assert [s.text for s in ruler_samples(name, length, 3, count, CORPUS, seed=5)] == [s.text for s in samples]
        assert len({s.text for s in samples}) == 3
        other = ruler_samples(name, length, 3, count, CORPUS, seed=6)
        assert [s.answers for s in other] != [s.answers for s in samples]


def test_the_answer_budget_holds_the_answer_for_a_byte_tokenizer():
    cwe = ruler_samples("cwe", 2048, 1, BYTES, CORPUS)[0]
    listed = " ".join(f"{i + 1}. {w}" for i, w in enumerate(cwe.answers))
    assert cwe.max_new_tokens >= 2 * len(listed.encode()) > TASKS["cwe"].tokens_to_generate
    assert ruler_samples("niah_single_1", 2048, 1, BYTES, CORPUS)[0].max_new_tokens == 128  # RULER's budget
    assert ruler_samples("vt", 2048, 1, BYTES, CORPUS, max_new_tokens=40)[0].max_new_tokens == 40


@pytest.mark.parametrize("name", [n for n in TASKS if n.startswith("niah")])
def test_needles_hold_the_answers_and_the_question_asks_for_their_keys(name):
    task = TASKS[name]
    kind = task.value
    for s in ruler_samples(name, 4096, 4, BYTES, CORPUS, seed=1):
        needles = re.findall(rf"One of the special magic {kind} for (\S+) is: (\S+)\.", s.text)
        question = s.text[s.text.rindex("\n") + 1 :]
        asked = re.search(r"for (.+) mentioned in the provided text\?", question).group(1)
        keys = [k.strip() for k in re.split(r", and |, ", asked)]
        assert len(keys) == task.queries
        wanted = [v for k, v in needles if k in keys]
        assert sorted(wanted) == sorted(s.answers)
        assert len(wanted) == task.queries * task.values
        if task.haystack == "needle":  # the distractors never use an asked key
            assert len(needles) == s.units + task.keys * task.values
        else:
            assert len(needles) == max(task.keys, task.queries) * task.values
        assert question.endswith("mentioned in the provided text is" if len(s.answers) == 1 else "text are")


def test_needle_depths_vary_and_the_corpus_is_the_haystack():
    places = []
    for s in ruler_samples("niah_single_2", 4096, 12, BYTES, CORPUS, seed=2):
        lines = s.text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("One of the special magic"))
        places.append(at / len(lines))
        assert sum(line.startswith("line ") for line in lines) == s.units  # the corpus lines, in order
    assert min(places) < 0.3 and max(places) > 0.7


def test_a_short_corpus_repeats_to_any_length():
    short = Haystack(["only one line of text here\n"], "one line")
    s = ruler_samples("niah_single_2", 4096, 1, BYTES, short)[0]
    assert s.units > 100 and s.text.count("only one line of text here") == s.units


def test_variable_tracking_answers_are_the_chain_of_the_asked_value():
    for s in ruler_samples("vt", 4096, 3, BYTES, CORPUS, seed=3):
        question = s.text[s.text.rindex("Question:") :]
        value = re.search(r"assigned the value (\d+) in the text", question).group(1)
        body = s.text[s.text.rindex("Memorize and track") : s.text.rindex("Question:")]
        assigned = dict(re.findall(r"VAR (\w+) = (VAR \w+|\d+)", body))
        holds = {v for v in assigned if _resolve(assigned, v) == value}
        assert holds == set(s.answers) and len(s.answers) == 5
        assert s.text.count("Memorize and track") == 2  # a worked example first, its answer given
        assert body.count("The grass is green.") == s.units


def _resolve(assigned: dict, var: str) -> str:
    v = assigned[var]
    return _resolve(assigned, v[4:]) if v.startswith("VAR ") else v


# RULER's counts: 6 / 1 below 4096 tokens, 30 / 3 from there on where they fit (bytes: not yet at 4096)
@pytest.mark.parametrize("length, high, low", [(2048, 6, 1), (4096, 6, 1), (12000, 30, 3)])
def test_common_words_answers_are_the_ten_most_frequent(length, high, low):
    for s in ruler_samples("cwe", length, 2, BYTES, CORPUS, seed=4):
        listed = s.text[s.text.rindex("Memorize the ones that appear most often.\n") :].split("\n")[1]
        counts = Counter(re.findall(r"\d+\. (\S+)", listed))
        top = [w for w, _ in counts.most_common(10)]
        assert set(top) == set(s.answers)
        assert {counts[w] for w in s.answers} == {high}
        assert set(counts.values()) == {high, low} and len(counts) == s.units


def test_a_length_too_short_is_one_error():
    with pytest.raises(TooShort, match=r"vt needs at least [\d,]+ tokens \(its smallest prompt and answer budget\), "
                                       r"got 300"):
        ruler_samples("vt", 300, 1, BYTES, CORPUS)
