"""RULER's synthetic long-context tasks (Hsieh et al., 2024), generated offline and deterministically from a seed."""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from .ruler_words import ADJECTIVES, NOUNS, VERBS

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER's 40 needle depths, in percent of the haystack
# at and above this many tokens, common-word extraction uses RULER's long-context repetition counts where they fit
# (a byte-level tokenizer spends about 4x RULER's tokens on the same list, so at 4096 only the short counts fit)
LONG = 4096

Kind = Literal["words", "numbers", "uuids"]


@dataclass(frozen=True)
class Niah:
    """A needle-in-a-haystack task: ``keys`` needles with ``values`` values each, ``queries`` of the keys asked."""

    haystack: Literal["repeat", "corpus", "needle"]
    key: Kind
    value: Kind
    keys: int = 1
    values: int = 1
    queries: int = 1
    tokens_to_generate: int = 128


@dataclass(frozen=True)
class VariableTracking:
    """``chains`` chains of ``hops`` assignments (``VAR B = VAR A``) from one number; the answer is every variable of
    the first chain."""

    chains: int = 1
    hops: int = 4
    tokens_to_generate: int = 30


@dataclass(frozen=True)
class CommonWords:
    """A numbered list where ``common`` words appear ``freq_common`` times and the others ``freq_uncommon`` times
    (6 and 1 below :data:`LONG` tokens, as in RULER, or where the long-context counts do not fit)."""

    common: int = 10
    freq_common: int = 30
    freq_uncommon: int = 3
    tokens_to_generate: int = 120


Task = Niah | VariableTracking | CommonWords

TASKS: dict[str, Task] = {
    "niah_single_1": Niah("repeat", "words", "numbers"),
    "niah_single_2": Niah("corpus", "words", "numbers"),
    "niah_single_3": Niah("corpus", "words", "uuids"),
    "niah_multikey_1": Niah("corpus", "words", "numbers", keys=4),
    "niah_multikey_2": Niah("needle", "words", "numbers"),
    "niah_multikey_3": Niah("needle", "uuids", "uuids"),
    "niah_multivalue": Niah("corpus", "words", "numbers", values=4),
    "niah_multiquery": Niah("corpus", "words", "numbers", keys=4, queries=4),
    "vt": VariableTracking(),
    "cwe": CommonWords(),
}


@dataclass
class RulerSample:
    """One prompt: ``text`` (the question and the answer prefix the model continues), the expected ``answers``, the
    haystack ``units`` used (filler sentences, corpus lines, distractor needles or list words), ``prompt_tokens`` (the
    model input with its separator) and ``max_new_tokens`` (the answer budget; prompt plus budget fit the length)."""

    task: str
    length: int
    index: int
    text: str
    answers: list[str]
    units: int
    prompt_tokens: int
    max_new_tokens: int


class Haystack:
    """The lines of a corpus, taken from the start and repeated as often as a context needs.

    Args:
        documents: the texts, in order; each contributes its lines (a line keeps its newline).
        source: what the text is (recorded with the results).
    """

    def __init__(self, documents: Sequence[str], source: str):
        ends = (doc if doc.endswith("\n") else doc + "\n" for doc in documents)
        self.lines = [line for doc in ends for line in doc.splitlines(True)]
        if not self.lines:
            raise ValueError(f"the haystack corpus {source} has no text")
        self.source = source

    def take(self, n: int) -> list[str]:
        """The first ``n`` lines, the corpus repeated when it is shorter."""
        whole, rest = divmod(n, len(self.lines))
        return self.lines * whole + self.lines[:rest]


def _words() -> list[str]:
    return [f"{a}-{n}" for a in ADJECTIVES for n in NOUNS]


KEY_WORDS = _words()  # adjective-noun pairs, as RULER's keys
LIST_WORDS = sorted(set(ADJECTIVES) | set(NOUNS) | set(VERBS))  # the words of common-word extraction


def _draw(rng: random.Random, kind: Kind) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))  # 7 digits
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return rng.choice(KEY_WORDS)


def _distinct(rng: random.Random, kind: Kind, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        v = _draw(rng, kind)
        if v not in out:
            out.append(v)
    return out


def _distractors(rng: random.Random, task: Niah, n: int, keys: list[str]) -> list[str]:
    """``n`` needles whose keys are none of ``keys``, drawn key then value, so that n + 1 extend the first n."""
    out: list[str] = []
    while len(out) < n:
        k = _draw(rng, task.key)
        if k not in keys:
            out.append(NEEDLE.format(kind=task.value, key=k, value=_draw(rng, task.value)))
    return out


def _join(items: list[str]) -> str:
    """``a``, ``a and b`` in RULER's form: ``a, b, and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


def _insert(units: list[str], items: list[str], fractions: list[float]) -> list[str]:
    """``units`` with ``items[i]`` inserted at ``fractions[i]`` of their length (sorted, in order)."""
    out, start = [], 0
    for item, f in sorted(zip(items, fractions), key=lambda p: p[1]):
        cut = int(len(units) * f)
        out += units[start:cut] + [item]
        start = cut
    return out + units[start:]


def niah_prompt(task: Niah, seed: str, n: int, haystack: Haystack | None) -> tuple[str, list[str]]:
    """(prompt with its answer prefix, answers) of a needle-in-a-haystack sample with ``n`` haystack units: filler
    sentences (``repeat``), corpus lines (``corpus``) or distractor needles (``needle``)."""
    rng = random.Random(seed)
    kind = task.value
    keys = _distinct(rng, task.key, max(task.keys, task.queries))
    values = [_distinct(rng, kind, task.values) for _ in keys]
    needles = [NEEDLE.format(kind=kind, key=k, value=v) for k, vs in zip(keys, values) for v in vs]
    rng.shuffle(needles)
    asked = rng.sample(range(len(keys)), task.queries)
    depths = [d / 100 for d in rng.sample(DEPTHS, len(needles))]
    noise = random.Random(seed + ":haystack")  # drawn in order, so n + 1 units extend the first n
    if task.haystack == "repeat":
        units, sep = [FILLER] * n, "\n"
    elif task.haystack == "needle":
        units, sep = _distractors(noise, task, n, keys), "\n"
    else:
        units, sep = haystack.take(n), ""
        needles = [nd + "\n" for nd in needles]
    context = sep.join(_insert(units, needles, depths))
    query = _join([keys[i] for i in asked])
    answers = [v for i in asked for v in values[i]]
    one = len(answers) == 1  # RULER's singular wording for one expected answer
    what, be = (kind[:-1], "is") if one else (kind, "are")
    text = (f"{'A' if one else 'Some'} special magic {what} {be} hidden within the following text. Make sure to "
            f"memorize it. I will quiz you about the {what} afterwards.\n{context.rstrip()}\nWhat "
            f"{'is the' if one else 'are all the'} special magic {what} for {query} mentioned in the provided text? "
            f"The special magic {what} for {query} mentioned in the provided text {be}")
    return text, answers


def _chain(rng: random.Random, task: VariableTracking, letters: int, n: int, sentence: str) -> tuple[str, list[str],
                                                                                                      str]:
    """(question with its answer prefix, the first chain's variables, the shared value) of one variable-tracking
    text with ``n`` filler sentences."""
    names: list[str] = []
    while len(names) < task.chains * (task.hops + 1):
        v = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if v not in names:
            names.append(v)
    chains, first, value = [], [], ""
    for c in range(task.chains):
        var = names[c * (task.hops + 1) : (c + 1) * (task.hops + 1)]
        start = str(rng.randint(10000, 99999))
        chains.append([f"VAR {var[0]} = {start}"] + [f"VAR {var[j + 1]} = VAR {var[j]}" for j in range(task.hops)])
        if c == 0:
            first, value = var, start
    units = [sentence] * n
    for chain in chains:
        units = _insert(units, chain, sorted(rng.random() for _ in chain))
    context = "\n".join(units)
    text = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
            f"{context}\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: "
            f"According to the chain(s) of variable assignment in the text above, {task.hops + 1} variables are "
            f"assigned the value {value}, they are:")
    return text, first, value


def vt_prompt(task: VariableTracking, seed: str, n: int, example_n: int) -> tuple[str, list[str]]:
    """(prompt with its answer prefix, the variables of the first chain) of a variable-tracking sample with ``n``
    filler sentences after a worked example of ``example_n`` (three-letter variables, its answer given)."""
    example, names, _ = _chain(random.Random(seed + ":example"), task, 3, example_n, FILLER)
    text, answers, _ = _chain(random.Random(seed), task, 5, n, FILLER)
    return f"{example} {' '.join(names)}\n\n{text}", answers


def _word_list(rng: random.Random, n: int, common: int, freq_common: int, freq_uncommon: int) -> tuple[str, list[str]]:
    vocab = LIST_WORDS if n <= len(LIST_WORDS) else LIST_WORDS + KEY_WORDS  # pairs when a context needs more words
    words = rng.sample(vocab, n)
    listed = words[:common] * freq_common + words[common:] * freq_uncommon
    rng.shuffle(listed)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), words[:common]


def cwe_prompt(task: CommonWords, seed: str, n: int, long: bool) -> tuple[str, list[str]]:
    """(prompt with its answer prefix, the common words) of a common-word-extraction sample of ``n`` distinct words
    after a worked example; ``long``: RULER's repetition counts for contexts of :data:`LONG` tokens and more."""
    freq = (task.freq_common, task.freq_uncommon) if long else (6, 1)
    example_words, example_freq = (40, (10, 3)) if long else (20, (3, 1))
    question = (f"Question: What are the {task.common} most common words in the above list? Answer: The top "
                f"{task.common} words that appear most often in the list are:")
    intro = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
             "that appear most often.\n")
    ex_list, ex_common = _word_list(random.Random(seed + ":example"), example_words, task.common, *example_freq)
    listed, common = _word_list(random.Random(seed), n, task.common, *freq)
    example = f"{intro}{ex_list}\n{question} " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ex_common))
    return f"{example}\n{intro}{listed}\n{question}", common


def _answer_text(task: Task, answers: list[str]) -> str:
    if isinstance(task, CommonWords):
        return " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(answers))
    return " " + (" ".join(answers) if isinstance(task, VariableTracking) else ", ".join(answers)) + "."


def _largest(fits: Callable[[int], bool], low: int, start: int | None = None) -> int | None:
    """The largest n >= ``low`` with ``fits(n)`` (taken as monotone: true up to some n), or None when ``low`` does not
    fit; searched upward by doubling from ``start``, then by bisection."""
    if not fits(low):
        return None
    good, bad = low, None
    step = max(1, (start or low) - low)
    while bad is None:
        probe = good + step
        if fits(probe):
            good, step = probe, step * 2
        else:
            bad = probe
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


class TooShort(ValueError):
    """A length shorter than a task's smallest prompt plus its answer budget; ``needed`` is that many tokens."""

    def __init__(self, task: str, length: int, needed: int):
        super().__init__(f"{task} needs at least {needed:,} tokens (its smallest prompt and answer budget), got "
                         f"{length:,}")
        self.task, self.length, self.needed = task, length, needed


def ruler_samples(name: str, length: int, samples: int, count: Callable[[str], int], haystack: Haystack | None,
                  seed: int = 0, max_new_tokens: int | None = None) -> list[RulerSample]:
    """``samples`` prompts of task ``name`` that fit ``length`` tokens each, answer budget included.

    Args:
        name: a task of :data:`TASKS`.
        length: tokens of prompt plus answer budget, counted by ``count``.
        samples: how many prompts.
        count: tokens of a text as the model reads it (the evaluated model's tokenizer).
        haystack: the corpus of the ``corpus`` haystacks (unused by the other tasks).
        seed: the seed every sample's generator derives from.
        max_new_tokens: the answer budget (default: the task's RULER budget, or twice the tokens of the expected
            answer when that is more, so that a byte-level tokenizer has room to write it).

    Raises TooShort when even the smallest haystack does not fit the length.

    Tasks (RULER's names and settings): needle in a haystack ``niah_single_1`` / ``_2`` / ``_3`` (one needle; a repeated
    filler, the corpus, the corpus with UUID values), ``niah_multikey_1`` / ``_2`` / ``_3`` (distractor needles with
    other keys: in the corpus, or the whole haystack made of them, UUID keys and values for ``_3``), ``niah_multivalue``
    (four values under one key), ``niah_multiquery`` (four keys asked at once), ``vt`` (variable tracking: one chain of
    four hops hidden in filler, one worked example first) and ``cwe`` (common-word extraction: the ten words repeated
    most in a numbered list, one worked example first).

    RULER's essay haystack is a corpus here: the embedded standard-library corpus (held-out documents first) or local
    files, cut into lines and repeated when a context needs more than it holds, so that any length can be built. Every
    prompt is sized with the evaluated model's own tokenizer: the most haystack for which the prompt, its answer prefix
    and the answer budget fit the length. Each sample is drawn from its own seeded generator (seed, task, length,
    index), so the same call gives the same samples on any machine with the same corpus.
    """
    task = TASKS[name]
    key = f"{seed}:{name}:{length}"

    def build(index: int, n: int) -> tuple[str, list[str]]:
        s = f"{key}:{index}"
        if isinstance(task, Niah):
            return niah_prompt(task, s, n, haystack)
        if isinstance(task, VariableTracking):
            return vt_prompt(task, s, n, example_n)
        return cwe_prompt(task, s, n, long)

    long, example_n = False, 0
    if isinstance(task, VariableTracking):  # the worked example gets at most an eighth of the length (500 tokens:
        # RULER's example at its shortest length, 4096)
        room = min(500, length // 8)
        example_n = _largest(lambda n: count(_chain(random.Random(0), task, 3, n, FILLER)[0]) <= room, 0) or 0
    low = task.common + 1 if isinstance(task, CommonWords) else 1
    budget = max_new_tokens or max(task.tokens_to_generate, 2 * count(_answer_text(task, build(0, low)[1])))
    if isinstance(task, CommonWords) and length >= LONG:
        long = True  # read by build(): RULER's long-context counts where their smallest prompt fits
        long = count(build(0, low)[0]) + budget <= length

    def fits_for(index: int) -> Callable[[int], bool]:
        return lambda n: count(build(index, n)[0]) + budget <= length

    n0 = _largest(fits_for(0), low, start=64)
    if n0 is None:
        raise TooShort(name, length, count(build(0, low)[0]) + budget)
    out = []
    for i in range(samples):
        n = n0 if fits_for(i)(n0) else _largest(fits_for(i), low)
        if n is None:
            raise TooShort(name, length, count(build(i, low)[0]) + budget)
        text, answers = build(i, n)
        out.append(RulerSample(name, length, i, text, answers, n, count(text), budget))
    return out
