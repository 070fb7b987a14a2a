#!/usr/bin/env python3
"""Writes a tiny FP8 checkpoint in compressed-tensors format, as llm-compressor's FP8 scheme
saves one, for Sieve's loading tests (model/README.md "FP8 weights"):

  config.json with quantization_config {quant_method compressed-tensors, format float-quantized,
    weights {num_bits 8, type float, strategy channel}, input_activations static per tensor,
    kv_cache_scheme {num_bits 8, type float, strategy tensor}, ignore [lm_head]}
  model.safetensors: embeddings, norms and lm_head in BF16; each layer linear as F8_E4M3
    `weight` [N, K], F32 `weight_scale` [N, 1], F32 `input_scale` [1]; each layer's
    self_attn.k_scale / v_scale (F32 scalars)
  tokenizer.json, tokenizer_config.json, generation_config.json copied from llama2_mha.

Weights are random e4m3 codes with one code of each row at +-448 (a per-channel quantizer's amax),
and scales with 8 significant bits, so the values dequantize and requantize exactly. Plain
Python (no numpy or torch). Usage: python3 scripts/make_fp8_checkpoint.py OUT_DIR [SEED]
"""
import json
import math
import os
import random
import shutil
import struct
import sys

VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 261, 64, 128, 2, 4, 2, 16


def e4m3_values():
    """The value of each e4m3 code (e4m3fn: bias 7, no infinities, 0x7f / 0xff NaN)."""
    values = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent = (code >> 3) & 0xF
        mantissa = code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            values.append(math.nan)
        elif exponent == 0:
            values.append(sign * mantissa / 8.0 * 2.0 ** -6)
        else:
            values.append(sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7))
    return values


E4M3 = e4m3_values()
FINITE_CODES = sorted((value, code) for code, value in enumerate(E4M3) if not math.isnan(value))


def to_e4m3(value):
    """The nearest e4m3 code (saturating at 448)."""
    value = max(-448.0, min(448.0, value))
    low, high = 0, len(FINITE_CODES) - 1
    while high - low > 1:
        middle = (low + high) // 2
        if FINITE_CODES[middle][0] <= value:
            low = middle
        else:
            high = middle
    below, above = FINITE_CODES[low], FINITE_CODES[high]
    return below[1] if value - below[0] <= above[0] - value else above[1]


def round_to_bits(value, bits):
    """`value` rounded to `bits` significant bits (exact in f32 and in products with e4m3)."""
    mantissa, exponent = math.frexp(value)
    return math.ldexp(round(mantissa * 2 ** bits), exponent - bits)


def bf16_bytes(values):
    out = bytearray()
    for value in values:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        bits += 0x7FFF + ((bits >> 16) & 1)
        out += struct.pack("<H", (bits >> 16) & 0xFFFF)
    return bytes(out)


def f32_bytes(values):
    return struct.pack("<%df" % len(values), *values)


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, bytes), written in order."""
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for _, _, _, data in tensors:
            out.write(data)


def main():
    out_dir = sys.argv[1]
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 20261207)
    os.makedirs(out_dir, exist_ok=True)
    tensors = []

    def normal_matrix(rows, cols, std):
        return [rng.gauss(0.0, std) for _ in range(rows * cols)]

    def bf16_tensor(name, shape, values):
        tensors.append((name, "BF16", shape, bf16_bytes(values)))

    def fp8_linear(prefix, rows, cols):
        codes = bytearray()
        scales = []
        for _ in range(rows):
            row = [to_e4m3(rng.gauss(0.0, 120.0)) for _ in range(cols)]
            row[rng.randrange(cols)] = 0x7E if rng.random() < 0.5 else 0xFE  # +-448: the amax
            codes += bytes(row)
            # Rows' scales spread over 4x, as real channels' do.
            scales.append(round_to_bits(0.08 / 448.0 * 2.0 ** rng.uniform(-1.0, 1.0), 8))
        tensors.append((prefix + ".weight", "F8_E4M3", [rows, cols], bytes(codes)))
        tensors.append((prefix + ".weight_scale", "F32", [rows, 1], f32_bytes(scales)))
        tensors.append((prefix + ".input_scale", "F32", [1], f32_bytes([rng.uniform(0.01, 0.05)])))

    bf16_tensor("model.embed_tokens.weight", [VOCAB, HIDDEN], normal_matrix(VOCAB, HIDDEN, 1.0))
    for layer in range(LAYERS):
        prefix = "model.layers.%d." % layer
        bf16_tensor(prefix + "input_layernorm.weight", [HIDDEN],
                    [1.0 + rng.gauss(0.0, 0.2) for _ in range(HIDDEN)])
        fp8_linear(prefix + "self_attn.q_proj", HEADS * HEAD_DIM, HIDDEN)
        fp8_linear(prefix + "self_attn.k_proj", KV_HEADS * HEAD_DIM, HIDDEN)
        fp8_linear(prefix + "self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN)
        fp8_linear(prefix + "self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM)
        tensors.append((prefix + "self_attn.k_scale", "F32", [], f32_bytes([rng.uniform(0.02, 0.1)])))
        tensors.append((prefix + "self_attn.v_scale", "F32", [], f32_bytes([rng.uniform(0.02, 0.1)])))
        bf16_tensor(prefix + "post_attention_layernorm.weight", [HIDDEN],
                    [1.0 + rng.gauss(0.0, 0.2) for _ in range(HIDDEN)])
        fp8_linear(prefix + "mlp.gate_proj", FFN, HIDDEN)
        fp8_linear(prefix + "mlp.up_proj", FFN, HIDDEN)
        fp8_linear(prefix + "mlp.down_proj", HIDDEN, FFN)
    bf16_tensor("model.norm.weight", [HIDDEN], [1.0 + rng.gauss(0.0, 0.2) for _ in range(HIDDEN)])
    bf16_tensor("lm_head.weight", [VOCAB, HIDDEN], normal_matrix(VOCAB, HIDDEN, 0.08))
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)

    fp8 = {"num_bits": 8, "type": "float", "symmetric": True}
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "bos_token_id": 256, "eos_token_id": [257, 260], "head_dim": HEAD_DIM,
        "hidden_act": "silu", "hidden_size": HIDDEN, "intermediate_size": FFN,
        "max_position_embeddings": 256, "mlp_bias": False, "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS, "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": VOCAB,
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": dict(fp8, strategy="channel", dynamic=False),
                "input_activations": dict(fp8, strategy="tensor", dynamic=False)}},
            "kv_cache_scheme": dict(fp8, strategy="tensor", dynamic=False),
            "ignore": ["lm_head"]},
    }
    with open(os.path.join(out_dir, "config.json"), "w") as out:
        json.dump(config, out, indent=2)
        out.write("\n")
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "models",
                          "llama2_mha")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(source, name), os.path.join(out_dir, name))


if __name__ == "__main__":
    main()
