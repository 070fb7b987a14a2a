"""Golden logits of Sieve's default model, for model/llama_model_test.cc.

  python3 scripts/train/make_golden.py [--model models/sieve-tiny-10m] \
      [--out testdata/sieve_tiny_10m_golden.safetensors]

The oracle is train.py's PyTorch Llama in fp32 over the exported bf16 weights (train.py checks that
model against transformers' LlamaForCausalLM on every export: export_check.json), run over a
passkey prompt tokenized by `sieve tokenize` (its ids are stored, so the test needs no tokenizer).
Writes input_ids [n] i32 and logits [n][V] f32 at every position.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import export_model  # noqa: E402
import train  # noqa: E402

# "There is an important info hidden inside a lot of irrelevant text. The pass key is 68021.
# Remember it. 68021 is the pass key. The grass is green.\nWhat is the pass key? The pass key is"
# through the model's tokenizer, BOS first (`sieve tokenize --tokenizer models/sieve-tiny-10m`).
PROMPT_IDS = [0, 1817, 294, 380, 927, 2914, 935, 2338, 260, 1870, 274, 2853, 512, 15, 296, 773,
              745, 294, 222, 7744, 1372, 15, 2818, 344, 15, 222, 7744, 1372, 294, 264, 773, 745,
              15, 296, 429, 294, 427, 369, 731, 294, 264, 773, 745, 32, 296, 773, 745, 294]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default="models/sieve-tiny-10m")
    parser.add_argument("--out", default="testdata/sieve_tiny_10m_golden.safetensors")
    args = parser.parse_args()
    hf = json.load(open(os.path.join(args.model, "config.json")))
    config = train.Config(**{k: hf[k] for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps",
        "max_position_embeddings")})
    model = train.Llama(config)
    state = export_model.read_safetensors(os.path.join(args.model, "model.safetensors"))
    model.load_state_dict({k: v.float() for k, v in state.items()})
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        logits = model(ids)[0].float()
    export_model.write_safetensors(
        {"input_ids": torch.tensor(PROMPT_IDS, dtype=torch.int32), "logits": logits.contiguous()},
        args.out)
    answer = logits[-1].argmax().item()
    print(f"wrote {args.out}: {len(PROMPT_IDS)} positions x {config.vocab_size}; "
          f"next token after the prompt: {answer}")


if __name__ == "__main__":
    main()
