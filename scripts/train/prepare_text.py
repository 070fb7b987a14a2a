"""Cleans the training corpora and splits them into training and held-out documents.

Every tenth document of each corpus (in sorted order) is held out, and so is every fifth essay
and the last tenth of Shakespeare; `sieve eval` takes its perplexity text and its needle
haystacks from the held-out part only (.data/eval/text, .data/eval/haystack).
"""
import argparse
import json
import os
import re

BROWN_NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "''", "'s", "n't", "'"}


def brown_document(raw):
    """The tagged Brown format (word/tag, one sentence a line) as plain text."""
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", raw):
        out = []
        for token in paragraph.split():
            word = token.rsplit("/", 1)[0] if "/" in token else token
            if word == "``":
                word = '"'
            no_space = word in BROWN_NO_SPACE_BEFORE or (out and out[-1] == '"open')
            if word == "''":
                word = '"'
            if out and out[-1] == '"open':
                out[-1] = '"'
            if out and not no_space:
                out.append(" ")
            out.append('"open' if word == '"' and token.startswith("``") else word)
        text = "".join(w if w != '"open' else '"' for w in out).strip()
        if text:
            paragraphs.append(text)
    return "\n".join(paragraphs)


def write_jsonl(path, documents):
    with open(path, "w", encoding="utf-8") as f:
        for source, name, text in documents:
            f.write(json.dumps({"source": source, "name": name, "text": text}) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--brown", required=True)
    parser.add_argument("--sotu", required=True)
    parser.add_argument("--fixtures", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    train, heldout = [], []

    def split(source, names, read, every):
        for index, name in enumerate(sorted(names)):
            text = read(name).strip()
            if text:
                (heldout if index % every == every - 1 else train).append((source, name, text))

    brown = [n for n in os.listdir(args.brown) if re.fullmatch(r"c[a-r]\d\d", n)]
    split("brown", brown, lambda n: brown_document(open(os.path.join(args.brown, n)).read()), 10)
    sotu = [n for n in os.listdir(args.sotu) if n.endswith(".txt")]
    split("sotu", sotu, lambda n: open(os.path.join(args.sotu, n), encoding="utf-8").read(), 10)
    essays_dir = os.path.join(args.fixtures, "haystack")
    essays = [n for n in os.listdir(essays_dir) if n.endswith(".txt")]
    split("essays", essays, lambda n: open(os.path.join(essays_dir, n), encoding="utf-8").read(),
          5)
    shakespeare = open(os.path.join(args.fixtures, "text", "tinyshakespeare.txt"),
                       encoding="utf-8").read()
    cut = shakespeare.rfind("\n\n", 0, len(shakespeare) * 9 // 10)
    train.append(("shakespeare", "tinyshakespeare-0.9", shakespeare[:cut]))
    heldout.append(("shakespeare", "tinyshakespeare-0.1", shakespeare[cut:].strip()))

    os.makedirs(os.path.join(args.out, "text"), exist_ok=True)
    write_jsonl(os.path.join(args.out, "text", "train.jsonl"), train)
    write_jsonl(os.path.join(args.out, "text", "heldout.jsonl"), heldout)
    for sub in ("haystack", "text"):
        os.makedirs(os.path.join(args.out, "eval", sub), exist_ok=True)
    for source, name, text in heldout:
        sub = "haystack" if source == "essays" else "text"
        stem = name.removesuffix(".txt")
        with open(os.path.join(args.out, "eval", sub, f"{source}-{stem}.txt"), "w",
                  encoding="utf-8") as f:
            f.write(text + "\n")
    for label, docs in (("train", train), ("heldout", heldout)):
        chars = sum(len(t) for _, _, t in docs)
        print(f"{label}: {len(docs)} documents, {chars / 1e6:.1f} M characters")


if __name__ == "__main__":
    main()
