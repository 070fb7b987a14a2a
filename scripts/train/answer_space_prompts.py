"""Passkey prompts as jsonl for `sieve eval --task jsonl`, in two forms that tokenize the same.

  python3 scripts/train/answer_space_prompts.py OUT_DIR   # -> OUT_DIR/ends-before-space.jsonl,
                                                          #    OUT_DIR/ends-with-space.jsonl

The default model retrieves a passkey when it writes the first answer token: the space before the
digits (its tokenizer, like Llama 3's, splits " 12345" into " " and the digits). In the first file
the prompt ends with "The pass key is", so that query is generated after the prefill; in the second
it ends with "The pass key is ", so it is the prompt's last token and inside the observation
window that SnapKV scores with. The token ids of prompt + answer are the same in both.
Ten prompts of about 2000 tokens, needle depths 0, 1/9, ..., 1.
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
import tasks  # noqa: E402


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    spec = tasks.load_spec()
    haystack = tasks.Haystack(spec, [])
    with open(os.path.join(out_dir, "ends-before-space.jsonl"), "w") as before, \
            open(os.path.join(out_dir, "ends-with-space.jsonl"), "w") as with_space:
        for index in range(10):
            rng = random.Random(f"space-{index}")
            prompt, answer = tasks.passkey(spec, rng, 6800, haystack, depth=index / 9)
            value = answer.strip().rstrip(".")
            for file, context in ((before, prompt), (with_space, prompt + " ")):
                file.write(json.dumps({"context": context, "input": "", "answers": [value],
                                       "metric": "substring"}) + "\n")


if __name__ == "__main__":
    main()
