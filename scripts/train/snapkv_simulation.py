"""SnapKV in PyTorch, independently of Sieve, to check Sieve's answers under it token for token.

  python3 scripts/train/snapkv_simulation.py --budget 900 --jsonl /tmp/prompts.jsonl
  sieve eval --task jsonl --data /tmp/prompts.jsonl --prompt-template "{context}{input}" \
      --lengths 2000 --max-tokens 10 --kv-policy snapkv --kv-budget 900

For niah prompts (needle at depth 1, about 1000 tokens, held-out essays) it prefills the default
model densely, keeps per layer and KV head the window plus the top (budget - window) positions of
SPARSITY.md's scores (window attention summed over the window, mean over the head's query heads,
max-pool 7), then generates greedily with the answer's queries seeing only the kept prompt
entries. It prints each prompt's expected value and the simulated answer, and writes the prompts
as jsonl so `sieve eval` can answer the same prompts under the same policy.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import tasks  # noqa: E402
import train  # noqa: E402
import window_attention  # noqa: E402


def kept_positions(model, ids, budget, window):
    """[layer] -> bool [G][n]: the prompt entries SnapKV keeps."""
    n = len(ids)
    kv_heads = model.c.num_key_value_heads
    keep = []
    for p in window_attention.attention_probabilities(model, ids):
        if n <= budget:
            keep.append(torch.ones(kv_heads, n, dtype=torch.bool))
            continue
        scores = p[:, n - window:n, :n - window].sum(1).view(kv_heads, -1, n - window).mean(1)
        pooled = F.max_pool1d(scores[None], 7, 1, 3)[0]
        mask = torch.zeros(kv_heads, n, dtype=torch.bool)
        for head in range(kv_heads):
            mask[head, torch.topk(pooled[head], budget - window).indices] = True
        mask[:, n - window:] = True
        keep.append(mask)
    return keep


def generate(model, ids, keep, max_tokens, eos):
    n = len(ids)
    c = model.c
    group = c.num_attention_heads // c.num_key_value_heads

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
        allowed = ~torch.ones(t, t, dtype=torch.bool).triu(1)
        allowed = allowed.expand(c.num_attention_heads, t, t).clone()
        # Queries after the prompt see only the kept prompt entries (prefill itself was dense).
        allowed[:, n:, :n] &= keep[self.layer_index].repeat_interleave(group, 0)[:, None, :]
        p = scores.masked_fill(~allowed[None], float("-inf")).softmax(-1)
        return self.o_proj((p @ v).transpose(1, 2).reshape(b, t, -1))

    original = train.Attention.forward
    train.Attention.forward = forward
    for index, layer in enumerate(model.model.layers):
        layer.self_attn.layer_index = index
    generated = []
    try:
        for _ in range(max_tokens):
            with torch.no_grad():
                token = model(torch.tensor([ids + generated]))[0, -1].argmax().item()
            if token == eos:
                break
            generated.append(token)
    finally:
        train.Attention.forward = original
    return generated


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default="models/sieve-tiny-10m")
    parser.add_argument("--sieve", default="build/release/sieve")
    parser.add_argument("--haystack", default=".data/eval/haystack/essays-avg.txt")
    parser.add_argument("--budget", type=int, default=900)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--jsonl", required=True, help="where to write the prompts")
    args = parser.parse_args()

    def tokenize(text):
        out = subprocess.run([args.sieve, "tokenize", "--tokenizer", args.model], input=text,
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    vocab = json.load(open(os.path.join(args.model, "tokenizer.json")))["model"]["vocab"]
    text_of = {index: piece for piece, index in vocab.items()}
    spec = tasks.load_spec()
    text = open(args.haystack, encoding="utf-8").read().replace("\n", " ")
    haystack = tasks.Haystack(spec, [s + " " for s in train.SENTENCE_END.split(text)
                                     if 20 <= len(s) <= 400])
    model = window_attention.load_model(args.model)
    with open(args.jsonl, "w") as out:
        for sample in range(args.samples):
            prompt, answer = tasks.niah(spec, random.Random(100 + sample), 3600, haystack,
                                        kind="essay", depth=1.0)
            value = answer.strip().rstrip(".")
            out.write(json.dumps({"context": prompt, "input": "", "answers": [value]}) + "\n")
            ids = tokenize(prompt)
            keep = kept_positions(model, ids, args.budget, args.window)
            generated = generate(model, ids, keep, 10, eos=1)
            answer_text = "".join(text_of[t] for t in generated).replace("\u0120", " ")
            answer_text = answer_text.replace("\u010a", "\\n")
            print(f"{len(ids)} tokens, expected {value}: snapkv@{args.budget} answers "
                  f"{answer_text!r}")


if __name__ == "__main__":
    main()
