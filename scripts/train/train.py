"""Trains Sieve's own long-context Llama on the GPU machine, resumably, and exports it as a
Hugging Face model directory (config.json, safetensors, tokenizer) that Sieve and transformers load.

  python3 scripts/train/train.py --data .data --work /tmp/sieve-train --out "$OUT" \
      --steps 4000 --time-limit 520

Each call trains until --steps or --time-limit seconds, saves a checkpoint in --work (model,
optimizer, step) and a loss log; the next call with the same --work resumes from it. A call on a
fresh machine resumes from --resume-weights (the fp32 weight files a call writes to --out with
--send-weights; the optimizer's moments start afresh). When --steps is reached the model is
exported to --work/model and bundled into --out.

Deterministic given --seed: row i of the data is built from its own seeded generator (the same rows
whatever the number of loader workers or where a call stopped), and the initial weights come from
the seed. GPU reductions are not bitwise reproducible, so two runs agree in their losses to
float noise, not bit for bit.

The data (see scripts/train/README.md): a fraction --text-fraction of rows are windows of natural
text; the rest hold long-context task examples packed back to back (tasks.py: passkey, needle in a
haystack with one or several keys or values, key-value lookup, variable tracking, common words;
retrieval by matching words from retrieval.py's phrase grammar; drawn by --task-weights),
preceded by natural text so every row is --seq-len tokens. Answer tokens weigh --answer-weight in
the loss.
"""
import argparse
import json
import math
import os
import random
import re
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
import tasks  # noqa: E402


# ---------------------------------------------------------------------------------------------
# The model: Llama as transformers' LlamaForCausalLM computes it (RMSNorm in fp32, rotate-half
# RoPE, SwiGLU, GQA), so its state dict exports under transformers' names unchanged.

class Config:
    def __init__(self, **kw):
        self.vocab_size = kw.get("vocab_size", 8192)
        self.hidden_size = kw.get("hidden_size", 256)
        self.intermediate_size = kw.get("intermediate_size", 768)
        self.num_hidden_layers = kw.get("num_hidden_layers", 8)
        self.num_attention_heads = kw.get("num_attention_heads", 4)
        self.num_key_value_heads = kw.get("num_key_value_heads", 2)
        self.head_dim = kw.get("head_dim", 64)
        self.rope_theta = kw.get("rope_theta", 100000.0)
        self.rms_norm_eps = kw.get("rms_norm_eps", 1e-5)
        self.max_position_embeddings = kw.get("max_position_embeddings", 4096)

    def hf(self, bos, eos):
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "hidden_act": "silu", "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
            "initializer_range": 0.02, "torch_dtype": "bfloat16", "bos_token_id": bos,
            "eos_token_id": eos,
        }


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def project(self, x, cos, sin):
        """q, k, v [B][H][T][D]: RoPE applied, each KV head repeated for its query heads."""
        c = self.c
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = c.num_attention_heads // c.num_key_value_heads
        return q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def forward(self, x, cos, sin):
        c = self.c
        b, t, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # old PyTorch (CPU smoke tests)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def init_weights(self, generator):
        """Normal(0, 0.02) weights, drawn on the CPU from the seed (the same on any machine)."""
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
                continue
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std_here = std / math.sqrt(2 * self.c.num_hidden_layers)  # GPT-2's depth scaling
            else:
                std_here = std
            p.copy_(torch.randn(p.shape, generator=generator) * std_here)

    def forward(self, ids):
        t = ids.shape[1]
        freqs = torch.outer(torch.arange(t, device=ids.device, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        x = self.model.embed_tokens(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def weighted_loss(model, ids, targets, weights):
    logits = model(ids).float()
    nll = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1),
                          reduction="none").view(targets.shape)
    return (nll * weights).sum() / weights.sum(), nll, logits


# ---------------------------------------------------------------------------------------------
# Data

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class Corpus:
    def __init__(self, data_dir, tokenizer, split):
        with open(os.path.join(data_dir, "text", f"{split}.jsonl"), encoding="utf-8") as f:
            self.docs = [json.loads(line) for line in f]
        bos = tokenizer.token_to_id(tasks_bos())
        eos = tokenizer.token_to_id(tasks_eos())
        encoded = tokenizer.encode_batch([d["text"] for d in self.docs], add_special_tokens=False)
        pieces = []
        for enc in encoded:
            pieces.append(np.array([bos] + enc.ids + [eos], dtype=np.int32))
        self.tokens = np.concatenate(pieces)
        # Haystack sentences, as `sieve eval` cuts its haystack files.
        self.sentences = []
        for d in self.docs:
            for s in SENTENCE_END.split(d["text"].replace("\n", " ")):
                if 20 <= len(s) <= 400:
                    self.sentences.append(s + " ")

    def window(self, rng, length):
        start = rng.randrange(0, len(self.tokens) - length)
        return self.tokens[start:start + length]


def tasks_bos():
    return "<|begin_of_text|>"


def tasks_eos():
    return "<|end_of_text|>"


class Rows(torch.utils.data.Dataset):
    """Row i: seq_len + 1 token ids and their loss weights, from generator seeded by (seed, i)."""

    def __init__(self, args, tokenizer, corpus, spec, rows):
        self.args, self.tok, self.corpus, self.spec = args, tokenizer, corpus, spec
        self.haystack = tasks.Haystack(spec, corpus.sentences)
        self.rows = rows
        self.eos = tokenizer.token_to_id(tasks_eos())

    def __len__(self):
        return self.rows

    def example(self, rng, max_tokens):
        target = rng.randint(min(128, max_tokens), max_tokens)
        chars = int(target * 3.6)
        for _ in range(6):
            task, (prompt, answer) = tasks.training_example(self.spec, rng, chars, self.haystack,
                                                            self.args.task_weights)
            enc = self.tok.encode(prompt + answer)
            ids = enc.ids + [self.eos]
            if len(ids) <= max_tokens:
                break
            chars = int(chars * max_tokens / len(ids) * 0.9)
        else:
            return None
        answer_start = next((i for i, (s, _) in enumerate(enc.offsets) if s >= len(prompt)),
                            len(enc.ids))
        weights = ([self.args.context_weight] * answer_start +
                   [self.args.answer_weight] * (len(ids) - answer_start))
        return task, ids, weights

    def __getitem__(self, index):
        rng = random.Random(f"{self.args.seed}-row-{index}")
        n = self.args.seq_len + 1
        ids, weights = [], []
        if rng.random() >= self.args.text_fraction:
            # Examples packed back to back (each opens with BOS); the first rows keep them
            # short, which puts many answers in a row while retrieval is being learnt.
            longest = n if index >= self.args.curriculum_rows else self.args.curriculum_len
            while n - len(ids) >= 128:
                made = self.example(rng, min(n - len(ids), longest))
                if made is None:
                    break
                ids += made[1]
                weights += made[2]
        filler = self.corpus.window(rng, n - len(ids))
        row = np.concatenate([filler, np.array(ids, dtype=np.int32)])
        filler_weight = 1.0 if not ids else self.args.context_weight
        w = np.concatenate([np.full(len(filler), filler_weight, np.float32),
                            np.array(weights, np.float32)])
        return torch.from_numpy(row.astype(np.int64)), torch.from_numpy(w)


def validation_sets(args, tokenizer, corpus, spec, device):
    """Fixed held-out examples per task (their own seed) and held-out text windows."""
    haystack = tasks.Haystack(spec, corpus.sentences)
    rows = Rows(args, tokenizer, corpus, spec, 0)
    sets = {}
    rng = random.Random(f"validation-{args.seed}")
    for name in tasks.TASKS:
        batch = []
        while len(batch) < args.val_rows:
            target = min(args.seq_len - 64, rng.choice((1024, 2048, 4000)))
            chars = int(target * 3.6)
            for _ in range(8):
                ex_rng = random.Random(rng.random())
                prompt, answer = tasks.validation_example(spec, ex_rng, name, chars, haystack)
                enc = tokenizer.encode(prompt + answer)
                if len(enc.ids) <= target:
                    break
                chars = int(chars * target / len(enc.ids) * 0.95)
            else:
                raise RuntimeError(f"no {name} example fits {target} tokens")
            start = next((i for i, (s, _) in enumerate(enc.offsets) if s >= len(prompt)),
                         len(enc.ids))
            batch.append((enc.ids, start))
        sets[name] = batch
    text_rng = random.Random(f"validation-text-{args.seed}")
    text = [corpus.window(text_rng, args.seq_len + 1) for _ in range(args.val_rows)]
    del rows
    return sets, torch.tensor(np.stack(text).astype(np.int64), device=device)


@torch.no_grad()
def validate(model, sets, text, device):
    """Teacher-forced: the share of examples whose answer tokens (all but the closing
    punctuation) are each the argmax."""
    model.eval()
    out = {}
    for name, batch in sets.items():
        correct = 0
        for ids, start in batch:
            x = torch.tensor([ids], device=device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
                logits = model(x[:, :-1])
            # All but the answer's last token: that is "." here, while examples that go on with
            # another question end the value with ".\n" (one token), which is no retrieval error.
            predicted = logits[0, start - 1:-1].argmax(-1)
            correct += int(torch.equal(predicted, x[0, start:-1]))
        out[name] = correct / len(batch)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
        losses = []
        for row in text:
            logits = model(row[None, :-1]).float()
            losses.append(F.cross_entropy(logits[0], row[1:]).item())
    out["heldout_text_loss"] = float(np.mean(losses))
    model.train()
    return out


# ---------------------------------------------------------------------------------------------
# Export

def export(model, tokenizer_dir, out_dir, max_shard_bytes, save_file=None):
    if save_file is None:
        from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    tok = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))
    vocab = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))
    added = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    bos, eos = added[tok["bos_token"]], added[tok["eos_token"]]
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.c.hf(bos, eos), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": eos,
                   "max_length": model.c.max_position_embeddings}, f, indent=2)
        f.write("\n")
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), "rb") as src, \
            open(os.path.join(out_dir, "tokenizer.json"), "wb") as dst:
        dst.write(src.read())
    tok["model_max_length"] = model.c.max_position_embeddings
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tok, f, indent=2)
        f.write("\n")
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
             for k, v in model.state_dict().items()}
    shards, current, size = [], {}, 0
    for name in sorted(state):
        nbytes = state[name].numel() * 2
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = state[name]
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(out_dir, "model.safetensors"), {"format": "pt"})
        return
    weight_map = {}
    for index, shard in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, file), {"format": "pt"})
        weight_map.update({name: file for name in shard})
    total = sum(v.numel() * 2 for v in state.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def check_with_transformers(model, model_dir, device):
    """transformers must load the export and compute the same logits."""
    from transformers import AutoTokenizer, LlamaForCausalLM
    hf = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).to(device)
    ours = Llama(model.c).to(device)
    ours.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
    ids = torch.randint(2, model.c.vocab_size, (2, 512), device=device)
    with torch.no_grad():
        a = hf(ids).logits
        b = ours(ids)
    rel = ((a - b).norm() / b.norm()).item()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sample = "The pass key is 12345. Remember it."
    return {"transformers_logits_rel_l2": rel,
            "transformers_tokens": tokenizer(sample)["input_ids"]}


# ---------------------------------------------------------------------------------------------

def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def save_weights(model, out_dir, max_bytes):
    """fp32 weights in files under max_bytes (the device tool brings back files up to 16 MiB)."""
    from safetensors.torch import save_file
    state = {k: v.detach().float().contiguous().cpu() for k, v in model.state_dict().items()}
    shard, size, index = {}, 0, 0
    for name in sorted(state):
        nbytes = state[name].numel() * 4
        if shard and size + nbytes > max_bytes:
            save_file(shard, os.path.join(out_dir, f"weights-{index}.safetensors"))
            shard, size, index = {}, 0, index + 1
        shard[name] = state[name]
        size += nbytes
    save_file(shard, os.path.join(out_dir, f"weights-{index}.safetensors"))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=".data", help="fetch_data.sh's output")
    p.add_argument("--work", required=True, help="checkpoints, tokenizer and the exported model")
    p.add_argument("--out", required=True, help="what comes back: logs, loss curve, the model")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", default="4000",
                   help="optimizer steps, or auto: as many as --time-limit allows at the speed of "
                   "steps 10-30 (the log records the number, to rerun with it)")
    p.add_argument("--time-limit", type=float, default=1e9, help="seconds of training this call")
    p.add_argument("--batch", type=int, default=32, help="rows per step")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--text-fraction", type=float, default=0.05,
                   help="rows of natural text alone (the corpus is small: more is memorised)")
    p.add_argument("--curriculum-rows", type=int, default=64000,
                   help="the first rows hold examples of at most --curriculum-len tokens")
    p.add_argument("--curriculum-len", type=int, default=1024)
    p.add_argument("--task-weights", default="", type=tasks.parse_weights,
                   help="TASK=WEIGHT,... over tasks.WEIGHTS: how often each task is drawn "
                   "(0 drops one); the others keep their defaults")
    p.add_argument("--answer-weight", type=float, default=5.0)
    p.add_argument("--context-weight", type=float, default=1.0,
                   help="loss weight of the tokens of task rows before each answer (haystacks, "
                   "filler text); text-only rows weigh 1. Below 1 the small corpus is seen less "
                   "often in the loss, so it is memorised less")
    p.add_argument("--val-every", type=int, default=250)
    p.add_argument("--val-rows", type=int, default=24)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--intermediate-size", type=int, default=768)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--resume-weights", help="a folder of weights-*.safetensors (fresh machine)")
    p.add_argument("--send-weights", action="store_true",
                   help="also write fp32 weights to --out when the call ends before --steps")
    p.add_argument("--tokenizer", help="the tokenizer's folder (default: WORK/tokenizer, trained "
                   "there when missing)")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()

    from tokenizers import Tokenizer
    import train_tokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.work, "log.jsonl")
    started = time.time()

    tok_dir = args.tokenizer or os.path.join(args.work, "tokenizer")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        t0 = time.time()
        tok = train_tokenizer.build(args.data, args.vocab_size, args.seed)
        train_tokenizer.save(tok, tok_dir, args.seq_len)
        print(f"tokenizer: {tok.get_vocab_size()} tokens in {time.time() - t0:.0f} s", flush=True)
    tokenizer = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))

    spec = tasks.load_spec()
    t0 = time.time()
    corpus = Corpus(args.data, tokenizer, "train")
    heldout = Corpus(args.data, tokenizer, "heldout")
    print(f"corpus: {len(corpus.tokens) / 1e6:.2f} M training tokens, "
          f"{len(heldout.tokens) / 1e6:.2f} M held out, {len(corpus.sentences)} haystack sentences"
          f" ({time.time() - t0:.0f} s)", flush=True)

    config = Config(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                    num_hidden_layers=args.layers, intermediate_size=args.intermediate_size,
                    num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                    head_dim=args.hidden_size // args.heads,
                    max_position_embeddings=args.seq_len)
    model = Llama(config)
    model.init_weights(torch.Generator().manual_seed(args.seed))
    model.to(device)
    decay = [p_ for n, p_ in model.named_parameters() if p_.dim() == 2 and "embed" not in n]
    no_decay = [p_ for n, p_ in model.named_parameters() if not (p_.dim() == 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
        **({"fused": True} if device.type == "cuda" else {}))
    step = 0
    ckpt_path = os.path.join(args.work, "checkpoint.pt")
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, map_location=device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
        print(f"resumed from {ckpt_path} at step {step}", flush=True)
    elif args.resume_weights:
        from safetensors.torch import load_file
        state = {}
        for name in sorted(os.listdir(args.resume_weights)):
            if name.startswith("weights-") and name.endswith(".safetensors"):
                state.update(load_file(os.path.join(args.resume_weights, name)))
        model.load_state_dict(state)
        step = json.load(open(os.path.join(args.resume_weights, "state.json")))["step"]
        print(f"resumed weights from {args.resume_weights} at step {step} (fresh optimizer)",
              flush=True)
    params = sum(p_.numel() for p_ in model.parameters())
    auto_steps = args.steps == "auto"
    args.steps = 100000 if auto_steps else int(args.steps)
    print(f"model: {params / 1e6:.2f} M parameters, step {step}"
          f"{' (steps: auto)' if auto_steps else f' of {args.steps}'}", flush=True)

    def step_loss(ids, targets, weights):
        return weighted_loss(model, ids, targets, weights)[0]

    if not args.no_compile and device.type == "cuda":
        step_loss = torch.compile(step_loss)  # fuses the norms, SwiGLU and the loss
    sets, val_text = validation_sets(args, tokenizer, heldout, spec, device)
    dataset = Rows(args, tokenizer, corpus, spec, args.steps * args.batch)
    sampler = list(range(step * args.batch, args.steps * args.batch))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler,
                                         num_workers=args.workers, pin_memory=True,
                                         prefetch_factor=4 if args.workers else None,
                                         persistent_workers=False)

    def checkpoint():
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step, "args": vars(args)}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    log = open(log_path, "a")
    t_validation = time.time()
    record = {"step": step, "validation": validate(model, sets, val_text, device)}
    validation_seconds = time.time() - t_validation
    print(json.dumps(record), flush=True)
    log.write(json.dumps(record) + "\n")
    tokens_seen = 0
    t_window = time.time()
    window_losses = []
    for ids, weights in loader:
        if step >= args.steps:
            break
        ids = ids.to(device, non_blocking=True)
        weights = weights.to(device, non_blocking=True)
        lr = lr_at(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = step_loss(ids[:, :-1], ids[:, 1:], weights[:, 1:])
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if auto_steps and step == 10:
            t_auto = time.time()
        if auto_steps and step == 30:
            # The schedule is fixed from here on: warmup ends later, so the first steps' learning
            # rates do not depend on it.
            per_step = (time.time() - t_auto) / 20
            remaining = args.time_limit - (time.time() - started) - 30
            # Each step also owes its share of the validations (and their checkpoints).
            per_step += 1.2 * validation_seconds / args.val_every
            args.steps = step + int(remaining / (per_step * 1.04))
            auto_steps = False
            print(f"steps: {args.steps} ({per_step * 1000:.0f} ms a step)", flush=True)
            log.write(json.dumps({"step": step, "steps": args.steps}) + "\n")
        tokens_seen += ids[:, :-1].numel()
        window_losses.append(loss.detach())
        if step % 25 == 0 or step == args.steps:
            elapsed = time.time() - t_window
            mean_loss = torch.stack(window_losses).mean().item()
            record = {"step": step, "loss": mean_loss, "lr": lr, "grad_norm": grad_norm.item(),
                      "tokens_per_s": tokens_seen / elapsed, "elapsed_s": time.time() - started}
            print(json.dumps(record), flush=True)
            log.write(json.dumps(record) + "\n")
            log.flush()
            tokens_seen, t_window, window_losses = 0, time.time(), []
        if step % args.val_every == 0 or step == args.steps:
            record = {"step": step, "validation": validate(model, sets, val_text, device)}
            print(json.dumps(record), flush=True)
            log.write(json.dumps(record) + "\n")
            log.flush()
            checkpoint()
        if time.time() - started > args.time_limit and step < args.steps:
            break
    checkpoint()
    log.close()
    print(f"stopped at step {step} of {args.steps} after {time.time() - started:.0f} s", flush=True)

    with open(os.path.join(args.out, "train_log.jsonl"), "w") as f:
        f.write(open(log_path).read())
    if step >= args.steps:
        model_dir = os.path.join(args.work, "model")
        export(model, tok_dir, model_dir, max_shard_bytes=15 * 1024 * 1024)
        check = check_with_transformers(model, model_dir, device)
        check["sieve_tokens_reference"] = tokenizer.encode(
            "The pass key is 12345. Remember it.").ids
        print(json.dumps(check), flush=True)
        with open(os.path.join(model_dir, "export_check.json"), "w") as f:
            json.dump(check, f, indent=2)
        os.system(f"cd {args.work} && tar czf {args.out}/model_small_files.tgz "
                  f"--exclude='*.safetensors' model")
        for name in os.listdir(model_dir):
            if name.endswith(".safetensors"):
                os.system(f"cp {model_dir}/{name} {args.out}/")
    elif args.send_weights:
        # The device tool brings back 8 files: the weights' files, the log, stdout and one
        # archive of the rest (the step and the tokenizer), which .resume/ takes unpacked.
        save_weights(model, args.out, 15 * 1024 * 1024)
        resume_dir = os.path.join(args.work, "resume")
        os.makedirs(resume_dir, exist_ok=True)
        with open(os.path.join(resume_dir, "state.json"), "w") as f:
            json.dump({"step": step, "steps": args.steps}, f)
        os.system(f"cp {tok_dir}/tokenizer.json {tok_dir}/tokenizer_config.json {resume_dir}/ && "
                  f"tar czf {args.out}/resume_small_files.tgz -C {resume_dir} .")


if __name__ == "__main__":
    main()
