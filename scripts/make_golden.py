#!/usr/bin/env python3
"""Generates Sieve's golden forward-pass fixtures with Hugging Face transformers as the oracle.

For each tiny random-weight model below it writes, under OUT/<name>/:
  config.json, generation_config.json, model.safetensors (or shards + index),
  tokenizer.json + tokenizer_config.json (the byte-level vocabulary of Sieve's embedded model),
  golden.safetensors: input_ids [n] i32, logits [n][V] f32 (every position, fp32, eager
  attention), greedy_ids [k] i32 (greedy continuation by full recomputation, EOS ignored).

Runs where torch + transformers exist (the GPU machine). The default set is small (head_dim 16/32)
and committed under testdata/models; `--set gpu` makes models with the head dims the CUDA kernels
support (64, 128), which gpu_check.sh generates on the GPU machine into testdata/models_gpu
(not committed). The GPU set also writes gpu_llama3_d64_fp8: an FP8_DYNAMIC checkpoint in
compressed-tensors format (each layer linear e4m3 with per-channel scales, activations dynamic per
token), whose golden logits are transformers' on the dequantized weights in fp32 (activations not
quantized): the reference issue 58's GPU tests compare Sieve's FP8 path against.
Usage: python3 scripts/make_golden.py OUT_DIR [--set cpu|gpu]
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

VOCAB = 261  # 256 bytes + 5 specials, as tokenizer/MakeEmbeddedByteTokenizer
BOS, EOS, EOT = 256, 257, 260
PROMPT_LEN = 40
# The FP8 model's test bounds a rate (argmax agreement at 85% of the positions): 200 positions make
# it a measurement rather than a count that one near-tie moves.
FP8_PROMPT_LEN = 200
GREEDY_STEPS = 24

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              rms_norm_eps=1e-5, bos_token_id=BOS, eos_token_id=[EOS, EOT],
              max_position_embeddings=256, initializer_range=0.08)

MODELS = {
    # name: (class, config kwargs, save dtype, max_shard_size)
    "llama2_mha": (LlamaForCausalLM, dict(num_attention_heads=4, num_key_value_heads=4,
                                          rope_theta=10000.0), torch.float32, None),
    "llama_gqa_bf16": (LlamaForCausalLM, dict(num_attention_heads=4, num_key_value_heads=2,
                                              rope_theta=10000.0), torch.bfloat16, None),
    "llama3_rope_sharded": (LlamaForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=64)),
        torch.float32, "150KB"),
    "llama_tied": (LlamaForCausalLM, dict(num_attention_heads=4, num_key_value_heads=1,
                                          tie_word_embeddings=True, rope_theta=10000.0),
                   torch.float32, None),
    "mistral_gqa": (MistralForCausalLM, dict(num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=32, sliding_window=None,
                                             rope_theta=1000000.0), torch.float32, None),
}


GPU_MODELS = {
    "gpu_llama3_d64": (LlamaForCausalLM, dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=64)),
        torch.bfloat16, None),
    "gpu_mistral_d128": (MistralForCausalLM, dict(
        hidden_size=256, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
        head_dim=128, sliding_window=None, rope_theta=1000000.0), torch.bfloat16, None),
    "gpu_llama_mha_d128_tied": (LlamaForCausalLM, dict(
        hidden_size=256, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
        head_dim=128, tie_word_embeddings=True, rope_theta=10000.0), torch.bfloat16, None),
}


def byte_level_vocab():
    # GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    mapping = dict(zip(bs, cs))
    return {chr(mapping[b]): b for b in range(256)}


SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_CHAT = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + "
               "message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + "
               "'<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
               "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def write_tokenizer(path):
    vocab = byte_level_vocab()
    for index, special in enumerate(SPECIALS):
        vocab[special] = 256 + index
    tok = {
        "version": "1.0",
        "added_tokens": [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": SPECIALS[0], "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": SPECIALS[0], "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": SPECIALS[0], "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {SPECIALS[0]: {"id": SPECIALS[0], "ids": [BOS],
                                                            "tokens": [SPECIALS[0]]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": SPECIALS[0], "eos_token": SPECIALS[4], "add_bos_token": True,
                   "chat_template": LLAMA3_CHAT,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, ensure_ascii=False)


FP8_MODEL = ("gpu_llama3_d64_fp8", GPU_MODELS["gpu_llama3_d64"])
LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_fp8_checkpoint(model, path):
    """Rewrites the saved bf16 checkpoint at `path` as llm-compressor's FP8_DYNAMIC scheme saves
    one: each layer linear's weight per-channel e4m3 (scale = row amax / 448) with `weight_scale`
    [N, 1] f32; embeddings, norms and lm_head as they are. Sets `model`'s linears to the
    dequantized values (code x scale), the oracle's weights."""
    tensors = {}
    with torch.no_grad():
        for pname, param in model.state_dict().items():
            if any(f".{linear}.weight" in pname for linear in LAYER_LINEARS):
                weight = param.float()
                scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
                codes = (weight / scale).to(torch.float8_e4m3fn)
                tensors[pname] = codes.contiguous()
                tensors[pname.replace(".weight", ".weight_scale")] = scale.contiguous()
                param.copy_((codes.float() * scale).to(param.dtype))
            else:
                tensors[pname] = param.contiguous()
    for name in os.listdir(path):
        if name.startswith("model") and name.endswith(".safetensors"):
            os.remove(os.path.join(path, name))
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    fp8 = {"num_bits": 8, "type": "float", "symmetric": True}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": dict(fp8, strategy="channel", dynamic=False),
            "input_activations": dict(fp8, strategy="token", dynamic=True)}},
        "ignore": ["lm_head"]}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def main():
    out_root = sys.argv[1]
    models = GPU_MODELS if "--set" in sys.argv and sys.argv[sys.argv.index("--set") + 1] == "gpu" \
        else MODELS
    print("transformers", transformers.__version__, "torch", torch.__version__)
    entries = list(models.items())
    if models is GPU_MODELS:
        entries.append(FP8_MODEL)
    for seed, (name, (cls, kwargs, save_dtype, shard)) in enumerate(entries):
        fp8 = name == FP8_MODEL[0]
        torch.manual_seed(1234 + seed)
        config_cls = MistralConfig if cls is MistralForCausalLM else LlamaConfig
        config = config_cls(**{**COMMON, **kwargs})
        config._attn_implementation = "eager"
        model = cls(config).eval()
        # Norm weights start at 1: perturb them so a missing norm would show.
        with torch.no_grad():
            for pname, param in model.named_parameters():
                if "norm" in pname:
                    param.add_(0.1 * torch.randn_like(param))
        path = os.path.join(out_root, name)
        os.makedirs(path, exist_ok=True)
        model.to(save_dtype)
        kwargs_save = {"safe_serialization": True}
        if shard:
            kwargs_save["max_shard_size"] = shard
        model.save_pretrained(path, **kwargs_save)
        model.generation_config.save_pretrained(path)
        write_tokenizer(path)
        # The oracle: the saved checkpoint loaded back in fp32, as a user would load it (RoPE's
        # inv_freq is recomputed in fp32; casting the in-memory model would round it to bf16).
        model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
        if fp8:
            quantize_fp8_checkpoint(model, path)
        gen = torch.Generator().manual_seed(99 + seed)
        length = FP8_PROMPT_LEN if fp8 else PROMPT_LEN
        ids = torch.cat([torch.tensor([BOS]), torch.randint(0, 256, (length - 1,), generator=gen)])
        with torch.no_grad():
            logits = model(ids[None]).logits[0].float()
            seq = ids.clone()
            greedy = []
            for _ in range(GREEDY_STEPS):
                nxt = int(model(seq[None]).logits[0, -1].argmax())
                greedy.append(nxt)
                seq = torch.cat([seq, torch.tensor([nxt])])
        save_file({"input_ids": ids.to(torch.int32).contiguous(),
                   "logits": logits.contiguous(),
                   "greedy_ids": torch.tensor(greedy, dtype=torch.int32)},
                  os.path.join(path, "golden.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__})
        print(name, "ok", sorted(os.listdir(path)))
        print(open(os.path.join(path, "config.json")).read())


if __name__ == "__main__":
    main()
