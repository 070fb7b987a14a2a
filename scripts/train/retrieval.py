"""Training examples of retrieval by matching words, from a phrase grammar with random words.

A needle states a fact: an entity (a person, a venue in a town, an object of some material, a
project, a tasks.json key), a relation (one of several synonyms) and a value of the relation's
kind (numbers, years, times, sums, codes, words, invented words, multi-word phrases, names).
The question restates the key in other words and another order: another synonym of the relation,
another surface form of the entity ("the bakery in Verlo" / "Verlo's bakery"), another sentence
shape. Distractor needles share the relation, the entity or part of the entity's name, so only
the whole key finds the answer; a template alone never does.

The tasks, by where the question stands:
- `retrieval`: after the context (as `sieve eval` asks).
- `retrieval-before`: before the context only; after it, an answer cue.
- `retrieval-both`: before the context and restated after it in other words.
- `retrieval-quote`: after the context; the answer first restates the key in the needle's own
  words ("The door code of Mirela Ostrand is 4417."), so the tokens that precede the value can
  only be predicted by reading the needle. Those are the tokens a prompt ends with in
  `sieve eval` ("... The special magic number for {key} ... is"): a model trained to find the
  needle while it writes them has the needle in SnapKV's observation window (the last prompt
  tokens) before the first answer token.

The word lists and sentence shapes here are the training grammar; the held-out evaluation set
(scripts/eval_heldout.py) has lists and shapes of its own, and scripts/eval_heldout_test.py checks
that the two share nothing. Deterministic: everything random comes from the `rng` passed in.
"""
import random
import re

FIRST_NAMES = [
    "Mirela", "Tomas", "Agnes", "Felix", "Ruth", "Oskar", "Lena", "Victor", "Clara", "Anton",
    "Greta", "Hugo", "Irene", "Jonas", "Karin", "Lukas", "Marta", "Nils", "Olga", "Pavel",
    "Rosa", "Stefan", "Tilda", "Ulrich", "Vera", "Walter", "Yvonne", "Adrian", "Bettina", "Conrad",
    "Dora", "Emil", "Frida", "Gustav", "Hanna", "Ivan", "Johanna", "Kurt", "Lotte", "Magnus",
    "Nora", "Otto", "Petra", "Rudolf", "Sonja", "Theo", "Ursula", "Viktor", "Wanda", "Xaver",
    "Alma", "Bruno", "Celia", "Dmitri", "Edith", "Fabian", "Gisela", "Horst", "Ida", "Jakob",
    "Klara", "Leon", "Mila", "Nikolai", "Ottilie", "Paula", "Quentin", "Renate", "Sven", "Tanja",
    "Ulla", "Valentin", "Wilma", "Yusuf", "Zora", "Arno", "Britta", "Cyril", "Daria", "Egon",
]
LAST_NAMES = [
    "Ostrand", "Keller", "Brandt", "Vogel", "Lindqvist", "Hartmann", "Novak", "Petrov", "Moreau",
    "Castell", "Dunmore", "Eriksen", "Falk", "Gruber", "Holm", "Ibsen", "Janssen", "Kowalski",
    "Lorenz", "Marek", "Nyberg", "Olsen", "Pfeiffer", "Quist", "Reuter", "Sandberg", "Thorne",
    "Ulmann", "Varga", "Wendt", "Yilmaz", "Zeller", "Albrecht", "Bauer", "Carlsen", "Dietrich",
    "Engel", "Fischer", "Gerhardt", "Haas", "Iversen", "Jung", "Krause", "Lang", "Maurer",
    "Neumann", "Ortega", "Pohl", "Richter", "Schulz", "Tamm", "Unger", "Voss", "Winkler",
    "Zimmer", "Adler", "Becker", "Conti", "Dahl", "Ebert", "Frey", "Gunnarsson", "Horvat",
    "Kessler", "Lund", "Moser", "Nagel", "Oberg", "Pauli", "Rask", "Stenberg", "Toth", "Weiss",
]
TOWNS = [
    "Verlo", "Calloway", "Ambersby", "Tressel", "Dunhaven", "Kestrow", "Marlowe", "Pennick",
    "Rothbury", "Saltmere", "Thornby", "Wexford", "Aldmoor", "Brackley", "Crestwick", "Dovering",
    "Elmsford", "Fenwick", "Glenrock", "Hollin", "Ivybridge", "Jarrow", "Kilbury", "Larkspur",
    "Millbrook", "Northam", "Oakhurst", "Pelham", "Quarrington", "Redhill", "Stanmore", "Tilbury",
    "Upton", "Vossberg", "Westcliff", "Yarrow", "Ashdown", "Birchfield", "Coldwater", "Dunmere",
]
VENUES = [
    "bakery", "library", "train station", "post office", "school", "museum", "town hall",
    "hospital", "fire station", "market", "bookshop", "pharmacy", "swimming pool", "theater",
    "bank", "hotel", "police station", "garage", "laundry", "dental clinic", "gym", "cinema",
    "florist", "butcher shop", "bus depot", "community center", "art gallery", "pet shop",
]
MATERIALS = [
    "copper", "wooden", "glass", "iron", "leather", "silver", "ceramic", "brass", "paper",
    "plastic", "stone", "woolen", "golden", "steel", "clay", "linen", "bamboo", "tin",
]
OBJECTS = [
    "kettle", "lamp", "box", "clock", "chair", "bowl", "mirror", "key", "spoon", "bell", "cup",
    "vase", "jar", "basket", "bucket", "tray", "bottle", "helmet", "compass", "ladder", "whistle",
    "candle holder", "umbrella stand", "pencil case", "flower pot", "picture frame",
]
COLORS = [
    "red", "orange", "yellow", "purple", "pink", "brown", "grey", "violet", "turquoise",
    "crimson", "beige", "maroon", "navy", "olive", "lavender", "magenta", "teal", "indigo",
]
ANIMALS = [
    "cat", "dog", "rabbit", "hamster", "goat", "pony", "ferret", "tortoise", "lizard", "donkey",
    "hedgehog", "squirrel", "badger", "otter", "beaver", "llama", "camel", "zebra", "panda",
    "koala", "weasel", "mole", "bat", "frog", "snail", "goldfish", "mouse", "rat", "sheep",
]
FRUITS = [
    "apple", "pear", "plum", "cherry", "banana", "mango", "peach", "apricot", "grape", "lemon",
    "lime", "melon", "papaya", "kiwi", "fig", "date palm fruit", "pineapple", "raspberry",
    "strawberry", "blueberry", "gooseberry", "quince", "lychee", "coconut", "tangerine",
]
INSTRUMENTS = [
    "violin", "cello", "flute", "trumpet", "clarinet", "oboe", "harp", "guitar", "banjo",
    "accordion", "saxophone", "trombone", "tuba", "ukulele", "drum", "xylophone", "mandolin",
    "bassoon", "harmonica", "organ",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
DISHES = [
    "lentil soup", "apple pie", "fish stew", "potato salad", "mushroom risotto", "bean chili",
    "cheese omelette", "roast chicken", "vegetable curry", "pea soup", "beef goulash",
    "tomato pasta", "corn bread", "rice pudding", "onion tart", "meatballs", "pancakes",
    "noodle soup", "fried rice", "carrot cake",
]
ADJECTIVES = [
    "quiet", "brave", "clever", "gentle", "happy", "lazy", "proud", "silent", "swift", "tiny",
    "wild", "calm", "eager", "fancy", "jolly", "kind", "lucky", "merry", "polite", "shy",
    "sleepy", "sunny", "tidy", "wise", "bold", "busy", "crisp", "loyal", "noble", "humble",
]
MOTTO_VERBS = [
    "sleep", "wait", "rest", "stop", "hurry", "forget", "falter", "complain", "look back", "give up",
]
MOTTO_NOUNS = [
    "rivers", "hands", "hearts", "drums", "wheels", "lanterns", "bridges", "sails", "kettles",
    "gardens", "engines", "ladders", "bells", "roads", "candles", "clocks",
]
PHRASE_VERBS = ["sings", "waits", "sleeps", "turns"]
PHRASE_TIMES = ["dawn", "noon", "dusk", "midnight"]
TIME_MINUTES = ["00", "15", "30", "45", "05", "50"]
CODE_WORDS = [
    "Bluefinch", "Ironleaf", "Redstone", "Moonrake", "Tallpine", "Greywind", "Copperhill",
    "Nightjar", "Sandpiper", "Stormgate", "Wolfbane", "Brightwater", "Hollowell", "Kingsfoil",
    "Frostmark", "Goldcrest", "Ravenhurst", "Silverbrook", "Thistledown", "Westmarch",
]
# Invented words: two or three of these syllables ("kalomi", "vorshidan").
SYLLABLES = [
    "ka", "lo", "mi", "ren", "tu", "vor", "shi", "dan", "pel", "ro", "zu", "mar", "ti", "nek",
    "sol", "bra", "qui", "fen", "lu", "gor", "ba", "wen", "dri", "mo",
]

# Each relation: its synonyms (any of them names it; the question takes another than the needle)
# and the kind of value it has.
RELATIONS = [
    (("access code", "entry code", "door code"), "number4"),
    (("phone extension", "extension number", "internal line"), "number3"),
    (("room number", "assigned room", "room"), "number2"),
    (("account number", "account ID", "customer number"), "number8"),
    (("favorite color", "preferred color", "color of choice"), "color"),
    (("pet", "animal companion", "house pet"), "pet"),
    (("password", "passphrase", "secret word"), "invented"),
    (("motto", "slogan", "watchword"), "motto"),
    (("meeting day", "day of the weekly meeting", "usual meeting day"), "weekday"),
    (("founding year", "year of founding", "year of establishment"), "year"),
    (("license plate", "plate number", "registration plate"), "code"),
    (("home town", "town of origin", "birthplace"), "town"),
    (("favorite fruit", "preferred fruit", "fruit of choice"), "fruit"),
    (("instrument", "musical instrument", "instrument of choice"), "instrument"),
    (("ticket number", "ticket code", "ticket"), "code"),
    (("contact person", "person to ask", "main contact"), "person"),
    (("opening time", "time of opening", "daily opening hour"), "time"),
    (("budget", "yearly budget", "allocated funds"), "money"),
    (("nickname", "pet name", "informal name"), "invented"),
    (("seat count", "number of seats", "capacity"), "number3"),
    (("code name", "cover name", "alias"), "codename"),
    (("lucky number", "favorite number", "number of good luck"), "number2"),
    (("serial number", "serial code", "serial"), "serial"),
    (("favorite dish", "preferred meal", "dish of choice"), "dish"),
    (("bus route", "route number", "route"), "number3"),
    (("radio channel", "channel number", "channel"), "number2"),
    (("mascot", "emblem animal", "team animal"), "mascot"),
    (("storage shelf", "shelf label", "shelf"), "shelf"),
    (("secret phrase", "code phrase", "recognition phrase"), "phrase"),
    (("guide", "tour guide", "visitor guide"), "person"),
]

# Needle sentences. {entity} is a surface form of the entity; {owner} one that takes "'s".
NEEDLES = [
    "The {relation} of {entity} is {value}.",
    "{owner}'s {relation} is {value}.",
    "For {entity}, the {relation} is {value}.",
    "{value} is the {relation} of {entity}.",
    "Remember: the {relation} for {entity} is {value}.",
    "Note that {entity} has {value} as its {relation}.",
    "The {relation} assigned to {entity} is {value}.",
    "According to the records, {owner}'s {relation} is {value}.",
    "Everyone knows the {relation} of {entity}: it is {value}.",
    "{entity} keeps {value} as the {relation}.",
    "If you need the {relation} of {entity}, it is {value}.",
    "The {relation} of {entity} was set to {value}.",
    "Write down the {relation} of {entity}, which is {value}.",
    "As for {entity}, the {relation} reads {value}.",
    "Since last year the {relation} of {entity} has been {value}.",
    "The {relation} listed for {entity} is {value}.",
    "It was decided that the {relation} of {entity} would be {value}.",
    "{entity} chose {value} as the {relation}.",
    "In the files, {entity} has the {relation} {value}.",
    "The {relation} that {entity} uses is {value}.",
    "Do not forget that {owner}'s {relation} is {value}.",
    "A short note says the {relation} of {entity} is {value}.",
]
# Questions, the key restated; {entity} and {owner} as in NEEDLES.
QUESTIONS = [
    "What is the {relation} of {entity}?",
    "What is {owner}'s {relation}?",
    "Which {relation} does {entity} have?",
    "Tell me the {relation} for {entity}.",
    "{entity}: what is the {relation}?",
    "Find the {relation} of {entity} in the text.",
    "What {relation} was given for {entity}?",
    "Do you know the {relation} of {entity}?",
    "Look up {entity} and give the {relation}.",
    "I need the {relation} that goes with {entity}.",
    "Which value is the {relation} of {entity}?",
    "What does the text say is the {relation} of {entity}?",
    "Can you recall {owner}'s {relation}?",
    "Give the {relation} of {entity}.",
]
# What follows the question: an answer cue the value comes after.
CUES = ["Answer:", "A:", "The answer is", "The {relation} of {entity} is", "{owner}'s {relation} is"]
INSTRUCTIONS = [
    "Read the text below and answer the question about it.\n",
    "The following text contains a few facts. Remember them; a question follows.\n",
    "Answer the question using the passage.\n",
    "Some facts are hidden in this text. Find the one asked for.\n",
    "",
]
# Before the context, the question goes in one of these.
BEFORE = [
    "Question: {question}\nRead the text and answer it.\n\n",
    "Keep this question in mind while you read: {question}\n\n",
    "{question} The answer is in the text below.\n\n",
]
AFTER_BEFORE = ["\n\nNow answer the question.", "\n\nAnswer the question asked above.", "\n\n"]
QUOTE_CUES = [
    "Answer with the sentence that says it:",
    "Quote the fact that answers this:",
    "Repeat the sentence from the text that answers it:",
]

TASKS = ("retrieval", "retrieval-before", "retrieval-both", "retrieval-quote")


def cap(text):
    return text[:1].upper() + text[1:]


def sentence(template, **fields):
    """A needle or question: capitalised, except a value it opens with (copied as it is)."""
    text = template.format(**fields)
    return text if template.startswith("{value}") else cap(text)


def invented_word(rng):
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))


class Entity:
    """One thing, its parts (which distractors may share) and its surface forms."""

    def __init__(self, kind, parts, forms, owners):
        self.kind, self.parts, self.forms, self.owners = kind, parts, forms, owners

    def surface(self, rng, avoid=None):
        """(form, owner form): another form than `avoid` when there is one."""
        index = rng.randrange(len(self.forms))
        if avoid is not None and len(self.forms) > 1 and index == avoid:
            index = (index + rng.randrange(1, len(self.forms))) % len(self.forms)
        return index, self.forms[index], self.owners[index]


def make_entity(spec, rng, kind, parts=None):
    if kind == "person":
        first, last = parts or (rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES))
        return Entity(kind, (first, last), [f"{first} {last}", f"{last}, {first}"],
                      [f"{first} {last}", f"{first} {last}"])
    if kind == "venue":
        venue, town = parts or (rng.choice(VENUES), rng.choice(TOWNS))
        return Entity(kind, (venue, town),
                      [f"the {venue} in {town}", f"{town}'s {venue}", f"the {town} {venue}"],
                      [f"the {town} {venue}", f"the {town} {venue}", f"the {town} {venue}"])
    if kind == "object":
        material, thing = parts or (rng.choice(MATERIALS), rng.choice(OBJECTS))
        return Entity(kind, (material, thing), [f"the {material} {thing}",
                                                f"the {thing} that is {material}"],
                      [f"the {material} {thing}", f"the {material} {thing}"])
    if kind == "project":
        (name,) = parts or ((rng.choice(CODE_WORDS) if rng.random() < 0.5
                             else cap(invented_word(rng))),)
        return Entity(kind, (name,), [f"project {name}", f"the {name} project"],
                      [f"project {name}", f"the {name} project"])
    adjective, noun = parts or (rng.choice(spec["key_adjectives"]), rng.choice(spec["key_nouns"]))
    return Entity("key", (adjective, noun), [f"{adjective}-{noun}", f"the {adjective} {noun}"],
                  [f"{adjective}-{noun}", f"the {adjective} {noun}"])


ENTITY_KINDS = ("person", "venue", "object", "project", "key")


def digits(rng, count):
    return str(rng.randrange(10 ** (count - 1), 10**count))


def make_value(rng, kind):
    if kind.startswith("number"):
        count = int(kind[len("number"):])
        return digits(rng, max(2, count + rng.randint(-1, 1)))
    if kind == "year":
        return str(rng.randint(1700, 2024))
    if kind == "time":
        return f"{rng.randint(5, 22)}:{rng.choice(TIME_MINUTES)}"
    if kind == "money":
        return f"{rng.randint(2, 99)},{rng.randint(0, 999):03d} dollars"
    if kind == "code":
        letters = "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(rng.randint(2, 3)))
        return f"{letters}-{digits(rng, rng.randint(2, 4))}"
    if kind == "serial":
        return "".join(rng.choice("0123456789ABCDEF") for _ in range(4)) + "-" + digits(rng, 2)
    if kind == "shelf":
        return f"{rng.choice('ABCDEFGH')}{rng.randint(1, 40)}"
    if kind == "color":
        return rng.choice(COLORS)
    if kind == "pet":
        return f"a {rng.choice(COLORS)} {rng.choice(ANIMALS)}"
    if kind == "mascot":
        return rng.choice(ANIMALS)
    if kind == "invented":
        return invented_word(rng)
    if kind == "motto":
        return f"{rng.choice(ADJECTIVES)} {rng.choice(MOTTO_NOUNS)} never {rng.choice(MOTTO_VERBS)}"
    if kind == "weekday":
        return rng.choice(WEEKDAYS)
    if kind == "town":
        return rng.choice(TOWNS)
    if kind == "fruit":
        return rng.choice(FRUITS)
    if kind == "instrument":
        return rng.choice(INSTRUMENTS)
    if kind == "person":
        return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
    if kind == "codename":
        return f"{rng.choice(ADJECTIVES)} {rng.choice(ANIMALS)}"
    if kind == "dish":
        return rng.choice(DISHES)
    if kind == "phrase":
        return (f"the {rng.choice(COLORS)} {rng.choice(OBJECTS)} {rng.choice(PHRASE_VERBS)} at "
                f"{rng.choice(PHRASE_TIMES)}")
    raise ValueError(kind)


class Fact:
    def __init__(self, entity, relation, value):
        self.entity, self.relation, self.value = entity, relation, value
        self.synonym = 0  # which of the relation's synonyms the needle uses
        self.form = 0  # which of the entity's forms the needle uses
        self.template = ""

    def needle(self, rng):
        synonyms = RELATIONS[self.relation][0]
        self.synonym = rng.randrange(len(synonyms))
        self.form, entity, owner = self.entity.surface(rng)
        self.template = rng.choice(NEEDLES)
        return sentence(self.template, relation=synonyms[self.synonym], entity=entity,
                        owner=owner, value=self.value) + " "

    def statement_prefix(self):
        """The needle sentence up to its value, as it stands in the text; the quoted answer."""
        synonyms = RELATIONS[self.relation][0]
        text = sentence(self.template, relation=synonyms[self.synonym],
                        entity=self.entity.forms[self.form],
                        owner=self.entity.owners[self.form], value="\0")
        return text, text.index("\0")

    def restated(self, rng):
        """A synonym and an entity form other than the needle's, where there are others."""
        synonyms = RELATIONS[self.relation][0]
        synonym = self.synonym
        if len(synonyms) > 1:
            synonym = (self.synonym + rng.randrange(1, len(synonyms))) % len(synonyms)
        _, entity, owner = self.entity.surface(rng, avoid=self.form)
        return synonyms[synonym], entity, owner


def question_text(rng, fact, template=None):
    relation, entity, owner = fact.restated(rng)
    return cap((template or rng.choice(QUESTIONS)).format(relation=relation, entity=entity,
                                                          owner=owner))


def cue_text(rng, fact):
    relation, entity, owner = fact.restated(rng)
    return cap(rng.choice(CUES).format(relation=relation, entity=entity, owner=owner))


def make_facts(spec, rng, count):
    """`count` facts with distinct (entity, relation) keys and distinct values. The first is the
    one asked for; the others are distractors: the same relation of another entity, another
    relation of the same entity, or an entity that shares part of its name."""
    kind = rng.choice(ENTITY_KINDS)
    target = Fact(make_entity(spec, rng, kind), rng.randrange(len(RELATIONS)), None)
    target.value = make_value(rng, RELATIONS[target.relation][1])
    while named_in(target.value, [target.entity]):  # Verlo, home town of the bakery in Verlo
        target.value = make_value(rng, RELATIONS[target.relation][1])
    facts, keys, values = [target], {(target.entity.forms[0], target.relation)}, {target.value}
    attempts = 0
    while len(facts) < count and attempts < 50 * count:
        attempts += 1
        style = rng.random()
        if style < 0.35:  # the same relation of a similar or another entity
            relation = target.relation
            entity = similar_entity(spec, rng, target.entity)
        elif style < 0.6:  # another relation of the same entity
            relation, entity = rng.randrange(len(RELATIONS)), target.entity
        elif style < 0.85:
            relation = rng.randrange(len(RELATIONS))
            entity = similar_entity(spec, rng, target.entity)
        else:
            relation = rng.randrange(len(RELATIONS))
            entity = make_entity(spec, rng, rng.choice(ENTITY_KINDS))
        value = make_value(rng, RELATIONS[relation][1])
        key = (entity.forms[0], relation)
        # A value inside another (12 in 4412, cat in a grey cat) or in a name would be stated
        # twice.
        if key in keys or any(value in v or v in value for v in values):
            continue
        if named_in(value, [f.entity for f in facts] + [entity]) or any(
                named_in(v, [entity]) for v in values):
            continue
        keys.add(key)
        values.add(value)
        facts.append(Fact(entity, relation, value))
    return facts


def named_in(value, entities):
    return any(value in form for entity in entities for form in entity.forms)


def similar_entity(spec, rng, entity):
    """An entity of the same kind sharing one part of its name (two-part names), else a fresh one."""
    fresh = make_entity(spec, rng, entity.kind)
    if len(entity.parts) < 2 or rng.random() < 0.3:
        return fresh
    keep = rng.randrange(2)
    parts = list(fresh.parts)
    parts[keep] = entity.parts[keep]
    return make_entity(spec, rng, entity.kind, tuple(parts))


def context_with(facts, rng, chars, haystack, kind):
    units = haystack.units(rng, chars, kind)
    needles = [(fact.needle(rng), rng.random()) for fact in facts]
    out = list(units)
    for needle, depth in sorted(needles, key=lambda nd: -nd[1]):
        out.insert(round(depth * len(units)), needle)
    return "".join(out)


def example(spec, rng, chars, haystack, task="retrieval", distractors=None, queries=1,
            kind=None):
    """(prompt, answer) of one of TASKS. `queries` > 1 asks further facts of the context after the
    first answer (question after the context only): more answer tokens per context."""
    kind = kind or rng.choice(("noise", "essay", "essay", "essay"))
    distractors = rng.randint(0, 8) if distractors is None else distractors
    facts = make_facts(spec, rng, 1 + distractors)
    context = context_with(facts, rng, chars, haystack, kind)
    target = facts[0]
    answer_value = " " + target.value + "."
    if task == "retrieval-before":
        prompt = (rng.choice(BEFORE).format(question=question_text(rng, target)) + context +
                  rng.choice(AFTER_BEFORE) + "\n" + cue_text(rng, target))
        return prompt, answer_value
    if task == "retrieval-both":
        first = rng.choice(QUESTIONS)
        second = rng.choice([q for q in QUESTIONS if q != first])
        prompt = (rng.choice(BEFORE).format(question=question_text(rng, target, first)) +
                  context + "\n\n" + question_text(rng, target, second) + "\n" +
                  cue_text(rng, target))
        return prompt, answer_value
    if task == "retrieval-quote":
        quoted, value_at = target.statement_prefix()
        prompt = (rng.choice(INSTRUCTIONS) + context + "\n\n" + question_text(rng, target) + " " +
                  rng.choice(QUOTE_CUES))
        return prompt, " " + quoted[:value_at] + target.value + quoted[value_at + 1:]
    prompt = (rng.choice(INSTRUCTIONS) + context + "\n\n" + question_text(rng, target) + "\n" +
              cue_text(rng, target))
    answer = answer_value
    asked = list(range(1, len(facts)))
    rng.shuffle(asked)
    for index in asked[:queries - 1]:
        fact = facts[index]
        answer += "\n" + question_text(rng, fact) + "\n" + cue_text(rng, fact) + " " + fact.value + "."
    return prompt, answer


def training_example(spec, rng, chars, haystack, task):
    queries = rng.randint(1, 3) if task == "retrieval" else 1
    return example(spec, rng, chars, haystack, task=task, queries=queries)


def validation_example(spec, rng, chars, haystack, task):
    """Fixed shapes for validation: natural haystack, four distractors, one query."""
    return example(spec, rng, chars, haystack, task=task, distractors=4, kind="essay")


def vocabulary(spec):
    """Every word of the grammar's lists and sentence shapes and of tasks.json (the existing
    tasks' wording and lists, also trained on), lower case. The held-out set's test checks that
    its own lists and shapes share none of these words (bar a few function words)."""
    lists = (FIRST_NAMES + LAST_NAMES + TOWNS + VENUES + MATERIALS + OBJECTS + COLORS + ANIMALS +
             FRUITS + INSTRUMENTS + WEEKDAYS + DISHES + ADJECTIVES + MOTTO_VERBS + MOTTO_NOUNS +
             PHRASE_VERBS + PHRASE_TIMES + CODE_WORDS + [s for synonyms, _ in RELATIONS
                                                         for s in synonyms])
    lists += ["the", "that", "is", "project", "a", "never", "at", "dollars"]
    texts = lists + sentence_shapes(spec)
    return {word.lower() for text in texts for word in re.findall(r"[A-Za-z]+", text)}


def sentence_shapes(spec):
    """The grammar's sentence shapes and every string of tasks.json, placeholders removed (each
    becomes a line break, so no word sequence runs across one)."""
    strings = []

    def walk(node):
        if isinstance(node, str):
            strings.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk({k: v for k, v in spec.items() if k != "comment"})
    shapes = NEEDLES + QUESTIONS + CUES + INSTRUCTIONS + BEFORE + AFTER_BEFORE + QUOTE_CUES
    return [re.sub(r"\{\w+\}", "\n", text) for text in shapes + strings]


if __name__ == "__main__":
    import json
    import os
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    import tasks
    spec = tasks.load_spec()
    hay = tasks.Haystack(spec, ["A sentence of text. ", "Another one here. "])
    rng = random.Random(0)
    for name in TASKS:
        print(json.dumps(example(spec, rng, 200, hay, task=name, distractors=3,
                                 queries=2 if name == "retrieval" else 1)))
