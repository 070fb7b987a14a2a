"""Exports fp32 training weights as the Hugging Face model directory Sieve ships.

  python3 scripts/train/export_model.py --weights WEIGHTS_DIR --tokenizer TOKENIZER_DIR \
      --out models/sieve-tiny-10m [--config-json train_args.json]

WEIGHTS_DIR holds the weights-*.safetensors files train.py sends back (--send-weights); the
result is config.json, generation_config.json, tokenizer.json, tokenizer_config.json and the
weights in bf16 (model.safetensors). Works without the `safetensors` package (this machine's
PyTorch from Debian has none): the format is an 8-byte header length, a JSON header and the raw
little-endian tensors.
"""
import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import train  # noqa: E402

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[begin:end])
        out[name] = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def write_safetensors(tensors, path, metadata=None):
    names = sorted(tensors)
    header, offset, blobs = {}, 0, []
    for name in names:
        t = tensors[name].contiguous()
        dtype = {v: k for k, v in DTYPES.items()}[t.dtype]
        # numpy has no bfloat16: its bytes go out as int16
        blob = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    if metadata:
        header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    state = {}
    for name in sorted(os.listdir(args.weights)):
        if name.startswith("weights-") and name.endswith(".safetensors"):
            state.update(read_safetensors(os.path.join(args.weights, name)))
    hidden = state["model.embed_tokens.weight"].shape[1]
    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("model.layers."))
    heads = state["model.layers.0.self_attn.q_proj.weight"].shape[0] // 64
    config = train.Config(
        vocab_size=state["model.embed_tokens.weight"].shape[0], hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=state["model.layers.0.mlp.gate_proj.weight"].shape[0],
        num_attention_heads=heads,
        num_key_value_heads=state["model.layers.0.self_attn.k_proj.weight"].shape[0] // 64,
        head_dim=64)
    model = train.Llama(config)
    model.load_state_dict(state)
    train.export(model, args.tokenizer, args.out, max_shard_bytes=1 << 40,
                 save_file=write_safetensors)
    print(f"exported {sum(t.numel() for t in state.values()) / 1e6:.2f} M parameters "
          f"({layers} layers, hidden {hidden}) to {args.out}")


if __name__ == "__main__":
    main()
