"""Where the default model looks when it answers a needle question, and what SnapKV's window sees.

  python3 scripts/train/window_attention.py [--task passkey|niah] [--samples 4] [--chars 3500]

For needle prompts built as `sieve eval` builds them (tasks.py, held-out essays as the haystack),
it runs the model in PyTorch (fp32, the exported weights) and prints, per layer:
- window: the share of the observation window's attention (the last --window prompt tokens,
  summed over them, mean over the query heads of each KV head: SPARSITY.md's scores) that falls on
  the answer value's tokens in the needle;
- answer: the same share for the query of the first answer token, the position whose attention
  copies the value when the model generates it;
- kept@B: for each budget B, the KV heads (of the layer's two) whose SnapKV selection (max-pool 7,
  top B - window positions) keeps the value's first two tokens.
A policy that scores by the window keeps the needle only where the window attends to it.
Needs the model's tokenizer through `sieve tokenize` (--sieve, default build/release/sieve).
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
import export_model  # noqa: E402
import tasks  # noqa: E402
import train  # noqa: E402


def load_model(model_dir):
    hf = json.load(open(os.path.join(model_dir, "config.json")))
    config = train.Config(**{k: hf[k] for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps",
        "max_position_embeddings")})
    model = train.Llama(config)
    state = export_model.read_safetensors(os.path.join(model_dir, "model.safetensors"))
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.eval()


def attention_probabilities(model, ids):
    """Every layer's attention probabilities [H][n][n] for one sequence."""
    probabilities = []

    def forward(self, x, cos, sin):
        c = self.c
        b, t, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        p = scores.masked_fill(mask, float("-inf")).softmax(-1)
        probabilities.append(p[0])
        return self.o_proj((p @ v).transpose(1, 2).reshape(b, t, -1))

    original = train.Attention.forward
    train.Attention.forward = forward
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        train.Attention.forward = original
    return probabilities


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default="models/sieve-tiny-10m")
    parser.add_argument("--sieve", default="build/release/sieve")
    parser.add_argument("--haystack", default=".data/eval/haystack")
    parser.add_argument("--task", default="passkey", choices=("passkey", "niah"))
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--chars", type=int, default=3500, help="context size (about 1k tokens)")
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--budgets", default="64,128,256,512")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]

    def tokenize(text):
        out = subprocess.run([args.sieve, "tokenize", "--tokenizer", args.model], input=text,
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    spec = tasks.load_spec()
    sentences = []
    for name in sorted(os.listdir(args.haystack)):
        text = open(os.path.join(args.haystack, name), encoding="utf-8").read()
        sentences += [s + " " for s in train.SENTENCE_END.split(text.replace("\n", " "))
                      if 20 <= len(s) <= 400]
    haystack = tasks.Haystack(spec, sentences)
    model = load_model(args.model)
    layers, kv_heads = model.c.num_hidden_layers, model.c.num_key_value_heads
    group = model.c.num_attention_heads // kv_heads
    window_share = torch.zeros(layers)
    answer_share = torch.zeros(layers)
    kept = {b: torch.zeros(layers, kv_heads) for b in budgets}
    for sample in range(args.samples):
        rng = random.Random(f"window-attention-{sample}")
        depth = (sample + 0.5) / args.samples
        if args.task == "passkey":
            prompt, answer = tasks.passkey(spec, rng, args.chars, haystack, depth=depth)
        else:
            prompt, answer = tasks.niah(spec, rng, args.chars, haystack, kind="essay", depth=depth)
        value = answer.strip().rstrip(".")
        ids = tokenize(prompt + answer)
        n = len(tokenize(prompt))
        first = len(tokenize(prompt[:prompt.index(value)]))  # the value's first token
        values = [first, first + 1]
        probabilities = attention_probabilities(model, ids)
        # The first answer token is the space before the digits; the query that copies the value's
        # first digits is the position that predicts them: the space itself (index n).
        for layer, p in enumerate(probabilities):
            window = p[:, n - args.window:n, :n - args.window].sum(1)  # [H][prefix]
            share = window[:, values].sum() / window.sum()
            window_share[layer] += share / args.samples
            answer_share[layer] += p[:, n, values].sum() / p[:, n, :n].sum() / args.samples
            scores = window.view(kv_heads, group, -1).mean(1)
            pooled = F.max_pool1d(scores[None], 7, 1, 3)[0]
            for budget in budgets:
                top = torch.topk(pooled, budget - args.window, dim=-1).indices
                for head in range(kv_heads):
                    kept[budget][layer, head] += all(v in top[head] for v in values) / args.samples
    print(f"{args.task}: {args.samples} samples of ~{n} tokens, window {args.window}; "
          "share of attention on the value's tokens, and the share of samples whose SnapKV "
          "selection keeps them (per KV head)")
    header = "layer  window  answer  " + "  ".join(f"kept@{b}".rjust(9) for b in budgets)
    print(header)
    for layer in range(layers):
        cells = "  ".join(" ".join(f"{kept[b][layer, h]:.2f}" for h in range(kv_heads)).rjust(9)
                          for b in budgets)
        print(f"{layer:5d}  {window_share[layer]:6.4f}  {answer_share[layer]:6.4f}  {cells}")


if __name__ == "__main__":
    main()
