#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (corpus/<target>/seed_*) from hand-made inputs and
small pieces of testdata/ and models/. Seeds are small (a few KB at most): libFuzzer mutates
them. Run from anywhere; it rewrites only the seed_* files, so inputs added by hand or from a
crash (named after what they found) stay. python3 fuzz/make_corpus.py
"""
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(target, name, data):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (folder / f"seed_{name}").write_bytes(data)


def clear_seeds():
    for path in CORPUS.glob("*/seed_*"):
        path.unlink()


# --- safetensors --------------------------------------------------------------------------------
def safetensors(header, data=b"", pad=True, length=None):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def safetensors_seeds():
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
    write("safetensors_fuzzer", "one_f32", safetensors(
        {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, f32))
    write("safetensors_fuzzer", "metadata_and_dtypes", safetensors({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
        "b": {"dtype": "F16", "shape": [1], "data_offsets": [6, 8]},
        "c": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]},
        "d": {"dtype": "I32", "shape": [], "data_offsets": [16, 20]},
        "e": {"dtype": "U8", "shape": [0, 7], "data_offsets": [20, 20]},
    }, bytes(range(20))))
    write("safetensors_fuzzer", "overlap", safetensors({
        "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
    }, bytes(6)))
    write("safetensors_fuzzer", "unsupported_dtype", safetensors(
        {"x": {"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}}, bytes(2)))
    write("safetensors_fuzzer", "fp8_weight_and_scales", safetensors({
        "w.weight": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [0, 4]},
        "w.weight_scale": {"dtype": "F32", "shape": [2, 1], "data_offsets": [4, 12]},
        "w.input_scale": {"dtype": "F32", "shape": [], "data_offsets": [12, 16]},
    }, bytes([0x38, 0xb8, 0x7e, 0x01]) + struct.pack("<3f", 0.5, 0.25, 0.1)))
    write("safetensors_fuzzer", "truncated", safetensors(
        {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, f32[:9]))
    write("safetensors_fuzzer", "header_too_long", safetensors({}, length=1 << 40))


# --- model_config -------------------------------------------------------------------------------
def model_config_seeds():
    for path in sorted((ROOT / "testdata" / "models").glob("*/config.json")):
        write("model_config_fuzzer", f"hf_{path.parent.name}", path.read_bytes())
    write("model_config_fuzzer", "hf_default_model",
          (ROOT / "models" / "sieve-tiny-10m" / "config.json").read_bytes())
    write("model_config_fuzzer", "generation_default_model",
          (ROOT / "models" / "sieve-tiny-10m" / "generation_config.json").read_bytes())
    write("model_config_fuzzer", "generation_llama2_mha",
          (ROOT / "testdata" / "models" / "llama2_mha" / "generation_config.json").read_bytes())
    write("model_config_fuzzer", "generation_sampling", json.dumps({
        "bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True, "temperature": 0.6,
        "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1}))
    write("model_config_fuzzer", "meta_llama3_style", json.dumps({
        "dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 1000,
        "multiple_of": 64, "ffn_dim_multiplier": 1.3, "norm_eps": 1e-5, "rope_theta": 500000.0,
        "use_scaled_rope": True, "rope_scaling_factor": 8.0}))
    write("model_config_fuzzer", "meta_mistral_style", json.dumps({
        "dim": 128, "n_layers": 1, "head_dim": 32, "hidden_dim": 256, "n_heads": 4,
        "n_kv_heads": 1, "norm_eps": 1e-5, "sliding_window": 64, "vocab_size": 512,
        "max_seq_len": 2048}))
    write("model_config_fuzzer", "hf_rope_parameters", json.dumps({
        "architectures": ["MistralForCausalLM"], "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
        "sliding_window": 32, "dtype": "float16", "eos_token_id": [1, 2],
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}))


# --- tokenizer files ----------------------------------------------------------------------------
def bytes_to_unicode():
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD))
                 + list(range(0xAE, 0x100)))
    mapping, extra = {}, 256
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(extra)
            extra += 1
    return mapping


def varint(value):
    out = b""
    while value >= 0x80:
        out += bytes([(value & 0x7F) | 0x80])
        value >>= 7
    return out + bytes([value])


def field_bytes(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def sentencepiece_model(pieces, byte_fallback=True):
    """pieces: (text, score, type) with SentencePiece's types (1 normal, 2 unk, 3 control, 6 byte)."""
    model = b""
    for text, score, kind in pieces:
        piece = field_bytes(1, text.encode()) + varint(2 << 3 | 5) + struct.pack("<f", score)
        model += field_bytes(1, piece + field_varint(3, kind))
    trainer = (field_varint(3, 2) + field_varint(35, 1 if byte_fallback else 0)
               + field_varint(40, 0) + field_varint(41, 1) + field_varint(42, 2))
    normalizer = field_bytes(1, b"identity") + field_varint(3, 1) + field_varint(4, 1)
    return model + field_bytes(2, trainer) + field_bytes(3, normalizer)


def tokenizer_files_seeds():
    write("tokenizer_files_fuzzer", "json_bytes_only",
          (ROOT / "testdata" / "models" / "llama2_mha" / "tokenizer.json").read_bytes())
    # The default model's tokenizer.json cut to its first merges: same structure, a few KB.
    full = json.loads((ROOT / "models" / "sieve-tiny-10m" / "tokenizer.json").read_text())
    vocab = full["model"]["vocab"]
    merges = full["model"]["merges"][:24]
    kept = {piece for merge in merges for piece in merge}
    kept |= {a + b for a, b in merges}
    small = dict(full)
    small["model"] = dict(full["model"])
    small["model"]["vocab"] = {p: i for p, i in vocab.items() if i < 258 or p in kept}
    small["model"]["merges"] = merges
    write("tokenizer_files_fuzzer", "json_with_merges", json.dumps(small, ensure_ascii=False))
    string_merges = dict(small)
    string_merges["model"] = dict(small["model"])
    string_merges["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    string_merges["model"]["ignore_merges"] = True
    string_merges["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True,
                                      "use_regex": True}
    string_merges["added_tokens"] = [{"id": 0, "content": "<s>", "special": True, "lstrip": True,
                                      "rstrip": False}]
    write("tokenizer_files_fuzzer", "json_string_merges", json.dumps(string_merges,
                                                                     ensure_ascii=False))
    # tiktoken: "<base64 token> <rank>" lines.
    import base64
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    for rank, word in enumerate([b"he", b"ll", b"hello", b" world", b"\n\n"], start=256):
        lines.append(f"{base64.b64encode(word).decode()} {rank}")
    write("tokenizer_files_fuzzer", "tiktoken", "\n".join(lines) + "\n")
    write("tokenizer_files_fuzzer", "tiktoken_short", "aGU= 0\nbGw= 1\r\nIQ== 2\n")
    # SentencePiece BPE with byte fallback.
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    pieces += [(p, -float(i), 1) for i, p in enumerate(
        ["\u2581", "h", "e", "l", "o", "he", "ll", "llo", "hello", "\u2581hello", "w", "\u2581w"])]
    write("tokenizer_files_fuzzer", "sentencepiece", sentencepiece_model(pieces))
    write("tokenizer_files_fuzzer", "sentencepiece_no_fallback",
          sentencepiece_model(pieces[:3] + pieces[259:], byte_fallback=False))


# --- tokenizer_config ---------------------------------------------------------------------------
def tokenizer_config_seeds():
    write("tokenizer_config_fuzzer", "llama2_mha",
          (ROOT / "testdata" / "models" / "llama2_mha" / "tokenizer_config.json").read_bytes())
    write("tokenizer_config_fuzzer", "default_model",
          (ROOT / "models" / "sieve-tiny-10m" / "tokenizer_config.json").read_bytes())
    write("tokenizer_config_fuzzer", "added_tokens", json.dumps({
        "added_tokens_decoder": {
            "261": {"content": "<tool>", "special": True, "lstrip": True, "rstrip": True},
            "262": {"content": "plain", "special": False}},
        "bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<|eot_id|>",
        "add_bos_token": False}))
    write("tokenizer_config_fuzzer", "named_templates", json.dumps({
        "chat_template": [
            {"name": "tool_use", "template": "{{ tools }}"},
            {"name": "default", "template":
             "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
             "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
             "{{ message['content'] + eos_token}}{% endif %}{% endfor %}"}],
        "bos_token": None}))
    write("tokenizer_config_fuzzer", "llama2_template", json.dumps({
        "chat_template": "{% if messages[0]['role'] == 'system' %}<<SYS>>\\n{% endif %}"
                         "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"}))


# --- tokenizer_roundtrip ------------------------------------------------------------------------
def roundtrip_seeds():
    texts = {
        "ascii": "Hello, world! This is a test sentence.",
        "code": "def f(x):\n\treturn x ** 2  # square\n",
        "cjk": "\u4eca\u65e5\u306f\u3001\u4e16\u754c\u3002 \ud55c\uad6d\uc5b4",
        "emoji_zwj": "\U0001F468\u200d\U0001F469\u200d\U0001F467 \u2764\ufe0f",
        "whitespace": "  a  \n\n\n b\t\t \u00a0c   ",
        "specials": "<|begin_of_text|>hi<|eot_id|><s>[INST] x [/INST]</s>",
        "numbers": "3.14159 and 1234567890, 007",
        "sentencepiece_space": "\u2581hello \u2581 world",
    }
    for name, text in texts.items():
        write("tokenizer_roundtrip_fuzzer", name, text)
    write("tokenizer_roundtrip_fuzzer", "invalid_utf8", b"ab\xc3(\xe2\x82\xff\xf0\x9f\x98")


# --- chat_template ------------------------------------------------------------------------------
def provider_input(template, gen_prompt, messages):
    """The bytes FuzzedDataProvider turns into (template, add_generation_prompt, messages) in
    chat_template_fuzzer: strings from the front (a backslash and another byte end one), numbers
    from the back."""
    def string(text):
        return text.encode().replace(b"\\", b"\\\\") + b"\\;"
    front = string(template)
    back = [1 if gen_prompt else 0, len(messages)]
    roles = ["system", "user", "assistant"]
    for role, content in messages:
        if role in roles:
            back += [1, roles.index(role)]
        else:
            back += [0]
            front += string(role)
        front += string(content)
    return front + bytes(reversed(back))


def chat_template_seeds():
    llama3 = json.loads((ROOT / "testdata" / "models" / "llama2_mha" / "tokenizer_config.json")
                        .read_text())["chat_template"]
    mistral = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
               "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
               "{{ message['content'] + eos_token}}{% endif %}{% endfor %}")
    llama2 = ("{% if messages[0]['role'] == 'system' %}<<SYS>>\n{% endif %}"
              "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}")
    conversation = [("system", "Be brief."), ("user", " Hi there \u3000"),
                    ("assistant", "Hello!"), ("user", "Tell me\na joke.")]
    write("chat_template_fuzzer", "llama3", provider_input(llama3, True, conversation))
    write("chat_template_fuzzer", "mistral", provider_input(mistral, False, conversation[1:]))
    write("chat_template_fuzzer", "llama2", provider_input(llama2, False, conversation))
    write("chat_template_fuzzer", "bad_roles", provider_input(
        "{{ tools }} <|start_header_id|><|end_header_id|><|eot_id|>", True,
        [("user", "a"), ("user", "b"), ("tool", "c"), ("system", "late")]))


# --- completion_request -------------------------------------------------------------------------
def http(method, path, body=None, chunked=False):
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
    if body is None:
        return head + "\r\n"
    head += "Content-Type: application/json\r\n"
    if chunked:
        middle = len(body) // 2
        chunks = "".join(f"{len(part):x}\r\n{part}\r\n" for part in (body[:middle], body[middle:]))
        return head + "Transfer-Encoding: chunked\r\n\r\n" + chunks + "0\r\n\r\n"
    return head + f"Content-Length: {len(body.encode())}\r\n\r\n" + body


def completion_request_seeds():
    bodies = {
        "completion": {"model": "sieve", "prompt": "Hello", "max_tokens": 8, "temperature": 0.7,
                       "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["\n", "."], "n": 2,
                       "logprobs": 3},
        "completion_ids": {"prompt": [72, 105, 33], "max_tokens": 4, "stop_token_ids": [257],
                           "ignore_eos": True, "stream": True,
                           "stream_options": {"include_usage": True}},
        "completion_batch": {"prompt": ["a", [1, 2, 3]], "best_of": 1, "echo": False,
                             "suffix": None, "logit_bias": {}},
        "chat": {"messages": [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Hi"}],
                 "max_completion_tokens": 16, "logprobs": True, "top_logprobs": 2,
                 "presence_penalty": 0.5, "frequency_penalty": -0.5,
                 "repetition_penalty": 1.1, "min_p": 0.05, "kv_policy": "snapkv"},
        "chat_parts": {"messages": [{"role": "developer", "content": None},
                                    {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]}],
                       "add_generation_prompt": False},
        "too_long": {"prompt": "x" * 600, "max_tokens": 2147483647},
    }
    for name, body in bodies.items():
        write("completion_request_fuzzer", f"body_{name}", json.dumps(body))
    write("completion_request_fuzzer", "http_completion",
          http("POST", "/v1/completions?x=1", json.dumps(bodies["completion"])))
    write("completion_request_fuzzer", "http_chat_chunked",
          http("POST", "/v1/chat/completions", json.dumps(bodies["chat"]), chunked=True))
    write("completion_request_fuzzer", "http_models", http("GET", "/v1/models"))


def main():
    clear_seeds()
    safetensors_seeds()
    model_config_seeds()
    tokenizer_files_seeds()
    tokenizer_config_seeds()
    roundtrip_seeds()
    chat_template_seeds()
    completion_request_seeds()
    sizes = sorted((p.stat().st_size, str(p.relative_to(ROOT))) for p in CORPUS.glob("*/*"))
    print(f"{len(sizes)} seeds, largest {sizes[-1][0]} bytes ({sizes[-1][1]})")


if __name__ == "__main__":
    main()
