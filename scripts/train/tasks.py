"""Long-context training examples in the shapes `sieve eval` asks about, and retrieval by matching
words in many other shapes.

The wording of the evaluation tasks comes from tools/eval/tasks.json, the same file `sieve eval`
compiles in, so the model is trained on exactly the prompts it is evaluated with (on other random
keys, values, depths and haystack text: training draws from its own seeds and the training split
of the text). The retrieval tasks (retrieval.py) come from a phrase grammar of their own, so that
the model learns to find a needle by its words rather than by one template. An example is
(prompt, answer): the prompt is prefix + context + question, the answer is what a correct model
continues with.

Lengths are in characters here, not tokens: `chars` is a budget for the context that the caller
derives from the tokens it wants (training only needs lengths spread over the range; the
evaluation side builds prompts to exact token counts with the model's tokenizer).
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import retrieval  # noqa: E402

SPEC_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "eval", "tasks.json")


def load_spec(path=SPEC_PATH):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def fill(template, **values):
    out = template
    for key, value in values.items():
        out = out.replace("{" + key + "}", str(value))
    return out


def random_digits(rng, digits):
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


class Haystack:
    """Units of filler: the noise sentence, or sentences of natural text."""

    def __init__(self, spec, sentences=None):
        self.noise = spec["noise_sentence"]
        self.sentences = sentences or []

    def units(self, rng, chars, kind):
        if kind == "noise" or not self.sentences:
            count = max(1, chars // len(self.noise))
            return [self.noise] * count
        units, used = [], 0
        index = rng.randrange(len(self.sentences))
        while used < chars:
            sentence = self.sentences[index % len(self.sentences)]
            units.append(sentence)
            used += len(sentence)
            index += 1
        return units


def insert_at_depths(units, needles_with_depths):
    """Places each (needle, depth in [0, 1]) between units, in order of depth."""
    out = list(units)
    # Insert from the deepest so earlier indices stay valid.
    for needle, depth in sorted(needles_with_depths, key=lambda nd: -nd[1]):
        out.insert(round(depth * len(units)), needle)
    return out


def make_key(spec, rng):
    return rng.choice(spec["key_adjectives"]) + "-" + rng.choice(spec["key_nouns"])


def passkey(spec, rng, chars, haystack, depth=None):
    t = spec["passkey"]
    value = random_digits(rng, t["value_digits"])
    depth = rng.random() if depth is None else depth
    units = haystack.units(rng, chars, "noise")
    context = "".join(insert_at_depths(units, [(fill(t["needle"], value=value), depth)]))
    return t["prefix"] + context + t["question"], fill(t["answer"], value=value)


def niah(spec, rng, chars, haystack, kind="essay", needles=1, multivalue=False, queries=1,
         depth=None):
    """Single needle (needles=1), multi-key (needles>1: distractor keys), multi-value (one key,
    several values, all asked for). `queries` > 1 asks further keys after the first answer
    (training only: more answer tokens per context)."""
    t = spec["niah"]
    keys = []
    while len(keys) < (1 if multivalue else needles):
        key = make_key(spec, rng)
        if key not in keys:
            keys.append(key)
    if multivalue:
        pairs = [(keys[0], random_digits(rng, t["value_digits"])) for _ in range(needles)]
    else:
        pairs = [(key, random_digits(rng, t["value_digits"])) for key in keys]
    depths = [rng.random() for _ in pairs]
    if depth is not None:
        depths[0] = depth
    units = haystack.units(rng, chars, kind)
    context = "".join(insert_at_depths(
        units, [(fill(t["needle"], key=k, value=v), d) for (k, v), d in zip(pairs, depths)]))
    if multivalue:  # listed in the order they appear in the text
        values = t["values_join"].join(v for (_, v), _ in sorted(zip(pairs, depths),
                                                                  key=lambda pd: pd[1]))
        return (t["prefix"] + context + fill(t["question_all"], key=keys[0]),
                fill(t["answer_all"], values=values))
    asked = list(range(len(pairs)))
    rng.shuffle(asked)
    if depth is not None:  # the queried needle is the one at the requested depth
        asked.remove(0)
        asked.insert(0, 0)
    prompt = t["prefix"] + context + fill(t["question"], key=pairs[asked[0]][0])
    answer = fill(t["answer"], value=pairs[asked[0]][1])
    for index in asked[1:queries]:
        answer += fill(t["question"], key=pairs[index][0]) + fill(t["answer"], value=pairs[index][1])
    return prompt, answer


def random_hex(rng, digits):
    return "".join(rng.choice("0123456789abcdef") for _ in range(digits))


def kv_retrieval(spec, rng, chars, depth=None, queries=1):
    t = spec["kv_retrieval"]
    pair_chars = len(fill(t["pair"], key="", value="")) + 2 * t["key_hex_digits"] + len(
        t["separator"])
    count = max(2, chars // pair_chars)
    pairs, seen = [], set()
    while len(pairs) < count:
        key = random_hex(rng, t["key_hex_digits"])
        if key in seen:
            continue
        seen.add(key)
        pairs.append((key, random_hex(rng, t["key_hex_digits"])))
    context = t["separator"].join(fill(t["pair"], key=k, value=v) for k, v in pairs) + t["suffix"]
    first = round((rng.random() if depth is None else depth) * (count - 1))
    asked = [first] + rng.sample([i for i in range(count) if i != first],
                                 min(queries - 1, count - 1))
    prompt = t["prefix"] + context + fill(t["question"], key=pairs[first][0])
    answer = fill(t["answer"], value=pairs[first][1])
    for index in asked[1:]:
        answer += fill(t["question"], key=pairs[index][0]) + fill(t["answer"], value=pairs[index][1])
    return prompt, answer


def random_name(rng, letters):
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(letters))


def variable_tracking(spec, rng, chars, haystack, hops=None):
    t = spec["variable_tracking"]
    hops = t["hops"] if hops is None else hops
    value = random_digits(rng, t["value_digits"])
    names = []
    while len(names) < hops + 1:
        name = random_name(rng, t["name_letters"])
        if name not in names:
            names.append(name)
    statements = [fill(t["first"], name=names[0], value=value)]
    statements += [fill(t["next"], name=names[i], previous=names[i - 1]) for i in range(1, len(names))]
    depths = sorted(rng.random() for _ in statements)
    units = haystack.units(rng, chars, "noise")
    context = "".join(insert_at_depths(units, list(zip(statements, depths))))
    question = fill(t["question"], value=value, count=len(names))
    return t["prefix"] + context + question, fill(t["answer"], names=t["names_join"].join(names))


def common_words(spec, rng, chars):
    t = spec["common_words"]
    words = rng.sample(spec["list_words"], len(spec["list_words"]))
    common, rare = words[: t["common"]], words[t["common"]:]
    line_chars = 12
    lines = max(2 * t["common"], chars // line_chars)
    repeats = max(t["rare_repeats_max"] + 2, round(t["common_share"] * lines / t["common"]))
    items = [w for w in common for _ in range(repeats)]
    rare_index = 0
    while len(items) < lines and rare_index < len(rare):
        items += [rare[rare_index]] * rng.randint(1, t["rare_repeats_max"])
        rare_index += 1
    rng.shuffle(items)
    context = "".join(fill(t["item"], index=i + 1, word=w) for i, w in enumerate(items))
    question = fill(t["question"], count=t["common"])
    in_order = sorted(common, key=items.index)  # listed in the order they first appear
    return t["prefix"] + context + question, fill(t["answer"], words=t["words_join"].join(in_order))


TASKS = ("passkey", "niah", "niah-multikey", "niah-multivalue", "kv-retrieval",
         "variable-tracking", "common-words") + retrieval.TASKS
# How often each task is drawn for a training row (train.py --task-weights overrides): about
# half the examples are the evaluation's own shapes, half the retrieval grammar's.
WEIGHTS = {"passkey": 2, "niah": 3, "niah-multikey": 3, "niah-multivalue": 2, "kv-retrieval": 3,
           "variable-tracking": 2, "common-words": 1, "retrieval": 6, "retrieval-before": 2,
           "retrieval-both": 3, "retrieval-quote": 3}


def parse_weights(text):
    """"name=weight,..." over WEIGHTS (tasks not named keep theirs; weight 0 drops a task)."""
    weights = dict(WEIGHTS)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in weights or not value:
            raise ValueError(f"--task-weights: '{item}' is not TASK=WEIGHT with TASK one of "
                             f"{', '.join(TASKS)}")
        weights[name] = float(value)
    if sum(weights.values()) <= 0:
        raise ValueError("--task-weights: every weight is 0")
    return weights


def training_example(spec, rng, chars, haystack, weights=None):
    """One example of a random task, with the extra queries training uses."""
    weights = weights or WEIGHTS
    task = rng.choices(TASKS, weights=[weights[name] for name in TASKS])[0]
    if task in retrieval.TASKS:
        return task, retrieval.training_example(spec, rng, chars, haystack, task)
    if task == "passkey":
        return task, passkey(spec, rng, chars, haystack)
    kind = rng.choice(("noise", "essay", "essay"))
    if task == "niah":
        return task, niah(spec, rng, chars, haystack, kind=kind)
    if task == "niah-multikey":
        needles = rng.randint(2, 8)
        return task, niah(spec, rng, chars, haystack, kind=kind, needles=needles,
                          queries=rng.randint(1, needles))
    if task == "niah-multivalue":
        return task, niah(spec, rng, chars, haystack, kind=kind, needles=rng.randint(2, 4),
                          multivalue=True)
    if task == "kv-retrieval":
        return task, kv_retrieval(spec, rng, chars, queries=rng.randint(1, 4))
    if task == "variable-tracking":
        return task, variable_tracking(spec, rng, chars, haystack, hops=rng.randint(1, 5))
    return task, common_words(spec, rng, chars)


def validation_example(spec, rng, name, chars, haystack):
    """One example of task `name` in the fixed shape validation measures."""
    if name in retrieval.TASKS:
        return retrieval.validation_example(spec, rng, chars, haystack, name)
    if name == "passkey":
        return passkey(spec, rng, chars, haystack)
    if name == "niah":
        return niah(spec, rng, chars, haystack, kind="essay")
    if name == "niah-multikey":
        return niah(spec, rng, chars, haystack, kind="essay", needles=4)
    if name == "niah-multivalue":
        return niah(spec, rng, chars, haystack, kind="essay", needles=4, multivalue=True)
    if name == "kv-retrieval":
        return kv_retrieval(spec, rng, chars)
    if name == "variable-tracking":
        return variable_tracking(spec, rng, chars, haystack)
    return common_words(spec, rng, chars)


if __name__ == "__main__":
    spec = load_spec()
    rng = random.Random(0)
    hay = Haystack(spec, ["A sentence of text. ", "Another one here. "])
    for name in TASKS:
        for _ in range(50):
            training_example(spec, rng, rng.randint(500, 12000), hay)
    print(passkey(spec, rng, 400, hay, depth=0.5))
    print(niah(spec, rng, 300, hay, needles=3, queries=2))
    print(niah(spec, rng, 300, hay, needles=3, multivalue=True))
    print(kv_retrieval(spec, rng, 300, queries=2))
    print(variable_tracking(spec, rng, 400, hay))
    print(common_words(spec, rng, 300))
    for name in retrieval.TASKS:
        print(validation_example(spec, rng, name, 300, hay))
