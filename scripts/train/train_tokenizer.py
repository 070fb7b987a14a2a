"""Trains the model's byte-level BPE tokenizer (Hugging Face `tokenizers`).

The same kind of tokenizer as Llama 3's: the Llama 3 split regex, then byte-level BPE; special
tokens <|begin_of_text|> (BOS, added in front of every encoded text) and <|end_of_text|> (EOS).
It learns its merges from the training text plus a few thousand task examples, so the task
wording, digits and hexadecimal keys have tokens of their own. Deterministic for given inputs.
"""
import argparse
import json
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import tasks

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def training_texts(data_dir, seed):
    with open(os.path.join(data_dir, "text", "train.jsonl"), encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]
    spec = tasks.load_spec()
    rng = random.Random(f"tokenizer-{seed}")
    haystack = tasks.Haystack(spec, ["A short sentence. "])
    for _ in range(3000):
        _, (prompt, answer) = tasks.training_example(spec, rng, rng.randint(200, 2000), haystack)
        yield prompt + answer


def build(data_dir, vocab_size, seed):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tokenizer.train_from_iterator(training_texts(data_dir, seed), trainer=trainer)
    bos = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                      special_tokens=[(BOS, bos)]),
    ])
    return tokenizer


def save(tokenizer, out_dir, max_len):
    os.makedirs(out_dir, exist_ok=True)
    tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=".data")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tok = build(args.data, args.vocab_size, args.seed)
    save(tok, args.out, 4096)
    print("vocabulary:", tok.get_vocab_size())
