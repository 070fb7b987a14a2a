#!/usr/bin/env python3
"""Tests the held-out needle set (scripts/eval_heldout.py) and the training grammar it is held out
from (scripts/train/retrieval.py):

- the held-out word lists and sentence shapes share no word (bar function words) and no
  three-word sequence with the training grammar or tools/eval/tasks.json, and no held-out word is
  one the training grammar could invent;
- the committed set (testdata/eval/heldout_needles.jsonl): its lengths and counts, each needle and
  each value exactly once in its context, the asked value first, the target needle at its depth,
  the question restating the key in the other words, only held-out shapes;
- with --sieve, every prompt's token count (BOS included) is at most its length and within one
  haystack sentence of it;
- the generator is deterministic and fits a context to its length;
- the training grammar: deterministic, the key restated in other words, the asked value stated
  once, quotes verbatim, the evaluation tasks' wording kept.

    python3 scripts/eval_heldout_test.py [--sieve build/release/sieve]   # CTest: eval_heldout_test
"""
import argparse
import json
import os
import random
import re
import sys
import unittest

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(SCRIPTS, "train"))
import eval_heldout  # noqa: E402
import retrieval  # noqa: E402
import tasks  # noqa: E402

SET_PATH = os.path.join(ROOT, "testdata", "eval", "heldout_needles.jsonl")
SIEVE = None  # set by --sieve

# Words any English sentence needs; the held-out shapes may share these and nothing else.
FUNCTION_WORDS = {
    "a", "an", "the", "of", "to", "in", "on", "at", "by", "for", "as", "is", "was", "be", "it",
    "its", "that", "this", "and", "had", "which", "about", "above", "there", "they", "s",
}


def words(text):
    return [w.lower() for w in re.findall(r"[A-Za-z]+", text)]


def held_out_lists():
    h = eval_heldout
    return (h.GIVEN_NAMES + h.ROLES + h.VESSEL_TYPES + h.VESSEL_NAMES + h.GEMS + h.SPICES +
            h.TREES + h.CONSTELLATIONS + h.FABRICS + h.FINISHES + ["kilohertz", "beneath"] +
            [p for phrasings, _ in h.RELATIONS for p in phrasings])


def held_out_shapes():
    # The entities' forms too (make_entity).
    shapes = eval_heldout.NEEDLES + eval_heldout.QUESTIONS + ["{x} the {x}", "the {x} called {x}",
                                                              "the {x} {x}", "{x} (a {x})"]
    return [re.sub(r"\{\w+\}", "\n", shape) for shape in shapes]


def trigrams(texts):
    out = set()
    for text in texts:
        for segment in text.split("\n"):
            w = words(segment)
            out.update(tuple(w[i:i + 3]) for i in range(len(w) - 2))
    return out


def load_set():
    with open(SET_PATH, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class DisjointTest(unittest.TestCase):
    def setUp(self):
        self.spec = tasks.load_spec()
        self.training = retrieval.vocabulary(self.spec)

    def test_training_vocabulary_covers_its_lists(self):
        # A check of the check: the training side's words are there to compare with.
        for word in ("mirela", "verlo", "door", "magic", "remember", "passphrase", "quiet"):
            self.assertIn(word, self.training)

    def test_no_shared_words(self):
        held_out = {w for text in held_out_lists() + held_out_shapes() for w in words(text)}
        self.assertGreater(len(held_out), 150)
        shared = (held_out & self.training) - FUNCTION_WORDS
        self.assertEqual(shared, set(), "held-out words that training also uses")

    def test_no_shared_three_word_sequences(self):
        shared = trigrams(held_out_shapes()) & trigrams(retrieval.sentence_shapes(self.spec))
        self.assertEqual(shared, set())

    def test_training_never_invents_a_held_out_word(self):
        invented = re.compile("(" + "|".join(retrieval.SYLLABLES) + "){2,3}")
        for word in {w for text in held_out_lists() for w in words(text)}:
            self.assertIsNone(invented.fullmatch(word), word)


def needle_pattern(templates):
    """A regex matching a sentence of one of `templates`, any placeholder filling."""
    parts = []
    for template in templates:
        pieces = re.split(r"\{\w+\}", template)
        parts.append("(?:" + "(.+?)".join(re.escape(p) for p in pieces) + ")")
    return re.compile("|".join(parts), re.IGNORECASE | re.DOTALL)


class CommittedSetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.records = load_set()

    def test_counts_and_fields(self):
        lengths = [r["length"] for r in self.records]
        self.assertEqual(sorted(set(lengths)), [1000, 2000, 4000])
        for length in (1000, 2000, 4000):
            self.assertEqual(lengths.count(length), 40)
        self.assertEqual(len({r["id"] for r in self.records}), len(self.records))
        for r in self.records:
            self.assertEqual(r["metric"], "substring")
            self.assertEqual(r["answers"], [r["values"][0]])
            self.assertEqual(len(r["needles"]), len(r["values"]))
            self.assertIn(r["depth"], (0.0, 0.25, 0.5, 0.75, 1.0))
        self.assertLess(os.path.getsize(SET_PATH), 2_000_000)

    def test_needles_and_values_stand_once(self):
        for r in self.records:
            context = r["context"].lower()
            for needle in r["needles"]:
                self.assertEqual(context.count(needle.lower()), 1, (r["id"], needle))
            for value in r["values"]:
                self.assertEqual(context.count(value.lower()), 1, (r["id"], value))
                self.assertNotIn(value.lower(), r["input"].lower())
            # The substring metric finds the answer in no other value.
            answer = eval_heldout.normalized(r["answers"][0])
            for value in r["values"][1:]:
                self.assertNotIn(answer, eval_heldout.normalized(value), r["id"])
                self.assertNotIn(eval_heldout.normalized(value), answer, r["id"])

    def test_target_needle_at_its_depth(self):
        for r in self.records:
            at = r["context"].index(r["needles"][0]) / len(r["context"])
            self.assertLess(abs(at - r["depth"]), 0.12, r["id"])

    def test_only_held_out_shapes(self):
        needles = needle_pattern(eval_heldout.NEEDLES)
        questions = needle_pattern(eval_heldout.QUESTIONS)
        for r in self.records:
            for needle in r["needles"]:
                self.assertIsNotNone(needles.fullmatch(needle), needle)
            self.assertIsNotNone(questions.fullmatch(r["input"]), r["input"])

    def test_question_restates_the_key(self):
        relations = [phrasings for phrasings, _ in eval_heldout.RELATIONS]
        restated = 0
        for r in self.records:
            needle, question = r["needles"][0], r["input"]
            # Which phrasing each uses: the longest that occurs (one contains the other's words).
            used = []
            for text in (needle, question):
                found = [(len(p), i, j) for i, ps in enumerate(relations) for j, p in enumerate(ps)
                         if p in text]
                used.append(max(found)[1:])
            self.assertEqual(used[0][0], used[1][0], r["id"])  # the same relation
            self.assertNotEqual(used[0][1], used[1][1], r["id"])  # in the other words
            restated += 1
        self.assertEqual(restated, len(self.records))

    def test_prompt_lengths(self):
        if not SIEVE:
            self.skipTest("needs --sieve")
        tokenizer = eval_heldout.SieveTokenizer(SIEVE,
                                                os.path.join(ROOT, "models", "sieve-tiny-10m"))
        counts = tokenizer.counts([r["context"] + "\n\n" + r["input"] for r in self.records])
        for r, count in zip(self.records, counts):
            self.assertLessEqual(count, r["length"], r["id"])
            # Short by less than a haystack sentence (at most 400 characters).
            self.assertGreater(count, r["length"] - 150, r["id"])


class CharTokenizer:
    """A stand-in with a token per 4 characters, BOS included."""

    def count(self, text):
        return 1 + (len(text) + 3) // 4

    def counts(self, texts):
        return [self.count(text) for text in texts]


class GeneratorTest(unittest.TestCase):
    def setUp(self):
        rng = random.Random(1)
        vocabulary = ["people", "country", "nation", "congress", "report", "treaty", "commerce",
                      "measures", "progress", "revenue", "citizens", "states", "government"]
        self.sentences = []
        for _ in range(4000):
            body = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(6, 30)))
            self.sentences.append(body.capitalize() + ". ")

    def test_deterministic_and_fitted(self):
        first = eval_heldout.generate(self.sentences, CharTokenizer(), [300, 1000], 5, seed=3)
        second = eval_heldout.generate(self.sentences, CharTokenizer(), [300, 1000], 5, seed=3)
        self.assertEqual(first, second)
        other = eval_heldout.generate(self.sentences, CharTokenizer(), [300, 1000], 5, seed=4)
        self.assertNotEqual(first, other)
        longest_sentence = max(CharTokenizer().count(s) for s in self.sentences)
        for r in first:
            count = CharTokenizer().count(r["context"] + "\n\n" + r["input"])
            self.assertLessEqual(count, r["length"])
            self.assertGreater(count, r["length"] - longest_sentence)


class TrainingGrammarTest(unittest.TestCase):
    def setUp(self):
        self.spec = tasks.load_spec()
        sentences = [f"Sentence number {word} of the haystack. " for word in
                     ("one", "two", "three", "four", "five", "six", "seven")]
        self.haystack = tasks.Haystack(self.spec, sentences)

    def test_deterministic(self):
        for task in retrieval.TASKS:
            a = retrieval.example(self.spec, random.Random(7), 800, self.haystack, task=task)
            b = retrieval.example(self.spec, random.Random(7), 800, self.haystack, task=task)
            self.assertEqual(a, b)

    def test_question_restates_the_key(self):
        rng = random.Random(2)
        changed = 0
        for _ in range(300):
            fact = retrieval.make_facts(self.spec, rng, 1)[0]
            fact.needle(rng)
            relation, entity, _ = fact.restated(rng)
            synonyms = retrieval.RELATIONS[fact.relation][0]
            self.assertNotEqual(relation, synonyms[fact.synonym])
            self.assertIn(relation, synonyms)
            if len(fact.entity.forms) > 1:
                self.assertNotEqual(entity, fact.entity.forms[fact.form])
                changed += 1
        self.assertGreater(changed, 200)

    def test_asked_value_stated_once_and_answered(self):
        rng = random.Random(3)
        for task in retrieval.TASKS * 50:
            prompt, answer = retrieval.example(self.spec, rng, 600, self.haystack, task=task,
                                               distractors=rng.randint(0, 8), kind="essay")
            if task == "retrieval-quote":
                # The answer is a needle, word for word, and stands once in the prompt.
                self.assertEqual(prompt.count(answer.strip()), 1, answer)
                continue
            value = answer.strip().split("\n")[0][:-1]
            stated = re.findall(r"(?<!\w)" + re.escape(value) + r"(?!\w)", prompt)
            self.assertEqual(len(stated), 1, (task, value))

    def test_distractor_values_apart(self):
        rng = random.Random(4)
        for _ in range(300):
            facts = retrieval.make_facts(self.spec, rng, 9)
            values = [f.value for f in facts]
            for i, a in enumerate(values):
                for b in values[i + 1:]:
                    self.assertFalse(a in b or b in a, (a, b))

    def test_evaluation_wording_kept(self):
        rng = random.Random(5)
        seen = set()
        for _ in range(600):
            task, (prompt, _) = tasks.training_example(self.spec, rng, 600, self.haystack)
            seen.add(task)
            if task == "niah":
                self.assertTrue(prompt.startswith(self.spec["niah"]["prefix"]))
            if task == "passkey":
                self.assertTrue(prompt.startswith(self.spec["passkey"]["prefix"]))
        self.assertEqual(seen, set(tasks.TASKS))

    def test_task_weights(self):
        weights = tasks.parse_weights("retrieval=0,passkey=9")
        rng = random.Random(6)
        drawn = {tasks.training_example(self.spec, rng, 300, self.haystack, weights)[0]
                 for _ in range(300)}
        self.assertNotIn("retrieval", drawn)
        self.assertIn("passkey", drawn)
        with self.assertRaises(ValueError):
            tasks.parse_weights("unknown=1")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sieve", help="the sieve binary: also check the prompts' token counts")
    args, rest = parser.parse_known_args()
    SIEVE = args.sieve
    unittest.main(argv=[sys.argv[0]] + rest)
