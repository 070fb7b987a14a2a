#!/usr/bin/env python3
"""A bounded soak with faults against `sieve serve` (docs/reliability.md, "Soak").

Starts `sieve serve` on a free loopback port with a KV pool small enough that running requests
are preempted, and drives it from many client threads (each with its own keep-alive connection)
with a seeded mix of:
  - good requests: completions and chat completions, streamed (SSE) and not, greedy and sampled
    (seeded or not), n > 1, batched prompts, token-id prompts, stop strings, logprobs, unknown
    fields, chunked request bodies, pipelined requests, and per-request KV policies (`kv_policy`: full, the server's
    default, snapkv, pyramidkv, streamingllm, h2o, a per-layer mix);
  - faults: streams cancelled after a few events (FIN or RST), clients that leave while waiting
    for a non-streamed answer, malformed bodies (bad JSON, wrong types and values, truncated
    bodies, bad chunk framing, bad Transfer-Encoding), oversize prompts, bodies over the limit,
    unknown models and routes, requests cut off mid-header or mid-body.
Then checks, each failing the run with a message:
  - every good request got a complete, well-formed answer (non-streamed: JSON with its choices
    and usage; streamed: well-framed SSE ending with `data: [DONE]`), every bad one its 4xx with
    an OpenAI-shaped error body, no 5xx anywhere (the client's view and the server's
    sieve:http_requests_total), and the server stayed up the whole time;
  - greedy and seeded answers under load equal the same request sent alone to the idle server
    afterwards, exactly, dense and sparse policies alike (checked on the CPU and with
    `-- --batch-invariant`; elsewhere counted and reported) (preemption is transparent: by
    recompute a sparse request prefills its prompt again and replays its generated tokens as
    decode steps; with `-- --preemption-mode swap` its pages go to host memory and back); each
    sparse one is also checked to be deterministic alone;
  - once the clients are done, every KV page is free (sieve:kv_cache_pages_used and every
    layer's sieve:kv_cache_pages_used_by_layer are 0, nothing running or waiting);
  - the server's RSS is flat over the second half of the load (see --rss-limit-mib);
  - requests were preempted (sieve:num_preemptions_total > 0) and aborted; with
    `-- --preemption-mode swap`, swapped out (sieve:num_swapped_out_total > 0), none recomputed
    instead or replayed, none left swapped out;
  - with prefix caching on (the default), prompt tokens were found in the cache
    (vllm:prefix_cache_hits_total > 0: the replays repeat prompts, each sparse one twice; not
    with `-- --batch-invariant`, which reuses cached prefixes in whole 256-token chunks only);
  - SIGTERM stops the server with exit status 0.
Prints a summary; --result-json writes it as JSON. Python 3 standard library only.

  python3 scripts/soak.py                                   # CI: 1,200 jobs, CPU, 1.5-3 min
  python3 scripts/soak.py --sieve build/release/sieve --requests 20000 --clients 32
  python3 scripts/soak.py --sieve build/gpu/sieve --device cuda --clients 64 --requests 5000
  python3 scripts/soak.py --sieve build/gpu/sieve --device cuda --clients 64 --requests 5000 \\
      --replay-max 1000 -- --batch-invariant              # strict: issue 62's GPU check
  python3 scripts/soak.py --sieve build/gpu/sieve --device cuda \\
      --model /models/Meta-Llama-3-8B-Instruct --kv-memory 512M --clients 128 --requests 20000

Arguments after `--` go to `sieve serve` as they are (replacing the soak's defaults for the
same flags, e.g. `-- --max-num-batched-tokens 2048`). Exit status: 0 every check passed, 1 a
check failed, 2 bad usage or the server did not start.
"""
import argparse
import collections
import json
import os
import random
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HOST = "127.0.0.1"
MODEL_NAME = ["sieve-tiny-10m"]  # the served name, from /v1/models once the server is up

# ---------------------------------------------------------------------------------------------
# A small HTTP/1.1 client on raw sockets: the soak needs to send malformed and truncated
# requests, close mid-response, and check the server's framing strictly (Content-Length or
# chunked, keep-alive honoured), which http.client would hide.


class ProtocolError(Exception):
    """The server's bytes are not a well-formed HTTP response."""


class ConnectionClosed(Exception):
    """The connection ended before a status line (no response at all)."""


class Response:
    def __init__(self, version, status, reason, headers):
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers  # lower-cased names
        self.body = b""

    def keep_alive(self):
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


class Connection:
    def __init__(self, port, timeout):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def send(self, data):
        self.sock.sendall(data)

    def close(self, reset=False):
        try:
            if reset:  # RST instead of FIN: SO_LINGER with a zero timeout
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.reader.close()
            self.sock.close()
        except OSError:
            pass

    def _line(self, what):
        line = self.reader.readline(65537)
        if not line.endswith(b"\r\n"):
            raise ProtocolError(f"{what}: {'connection closed' if not line else 'bad line'} "
                                f"({line[:80]!r})")
        return line[:-2]

    def read_head(self):
        while True:
            first = self.reader.readline(65537)
            if not first:
                raise ConnectionClosed("the connection closed without a response")
            if not first.endswith(b"\r\n"):
                raise ProtocolError(f"bad status line {first[:80]!r}")
            match = re.match(rb"(HTTP/1\.[01]) (\d{3}) ?(.*)$", first[:-2])
            if not match:
                raise ProtocolError(f"bad status line {first[:80]!r}")
            headers = {}
            while True:
                line = self._line("header")
                if not line:
                    break
                name, colon, value = line.decode("latin-1").partition(":")
                if not colon:
                    raise ProtocolError(f"bad header line {line[:80]!r}")
                name = name.strip().lower()
                value = value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            status = int(match.group(2))
            if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
                continue
            return Response(match.group(1).decode(), status, match.group(3).decode("latin-1"),
                            headers)

    def chunks(self, response):
        """Yields the body's pieces as they arrive (chunked or Content-Length)."""
        coding = response.headers.get("transfer-encoding")
        if coding is not None:
            if coding.lower() != "chunked":
                raise ProtocolError(f"response Transfer-Encoding {coding!r}")
            if "content-length" in response.headers:
                raise ProtocolError("response has both Content-Length and Transfer-Encoding")
            while True:
                size_line = self._line("chunk size")
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {size_line[:40]!r}") from None
                if size == 0:
                    while self._line("trailer"):
                        pass
                    return
                data = self.reader.read(size)
                if len(data) != size or self.reader.read(2) != b"\r\n":
                    raise ProtocolError("a chunk was cut short")
                yield data
        length = response.headers.get("content-length")
        if length is None:
            raise ProtocolError("response with neither Content-Length nor chunked")
        data = self.reader.read(int(length))
        if len(data) != int(length):
            raise ProtocolError(f"body of {len(data)} bytes, Content-Length {length}")
        if data:
            yield data

    def read_response(self):
        response = self.read_head()
        response.body = b"".join(self.chunks(response))
        return response


def build_request(method, path, body=None, chunked=False, headers=()):
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}", "User-Agent: sieve-soak"]
    lines += list(headers)
    if body is None:
        return ("\r\n".join(lines) + "\r\n\r\n").encode()
    lines.append("Content-Type: application/json")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        pieces, at = [], 0
        while at < len(body):  # uneven chunks, one with an extension
            size = min(len(body) - at, 1 + (at * 7 + 13) % 97)
            ext = ";soak=1" if at == 0 else ""
            pieces.append(f"{size:x}{ext}\r\n".encode() + body[at:at + size] + b"\r\n")
            at += size
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + b"".join(pieces) + b"0\r\n\r\n"
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# ---------------------------------------------------------------------------------------------
# What the soak sends.

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing "
         "matches under pale autumn light river stone garden window memory number seventeen "
         "passkey remember story ocean mountain silver engine castle lantern winter paper "
         "north south kettle violin harbour meadow thunder copper").split()
UNICODE_BITS = ["café", "naïve", "Grüße", "日本語", "emoji 🚀", "Ωmega", "über"]
SYSTEM_PROMPTS = [None, "Be brief.", "You are a helpful assistant."]


def make_prompts(count, seed):
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 36))]
        if index % 6 == 5:
            words.insert(rng.randrange(len(words)), rng.choice(UNICODE_BITS))
        prompts.append(" ".join(words))
    return prompts


# Per-request KV policies (None: no kv_policy field, the server's default). Dense ones must answer
# greedy and seeded requests under load exactly as alone.
DENSE_POLICIES = ["full"]
POLICY_WEIGHTS = [("full", 40), ("snapkv", 9), ("pyramidkv", 7), ("streamingllm", 8), ("h2o", 9),
                  ("full:0-1,snapkv:2-7", 4), ("full:0-3,h2o:4-7", 4), (None, 9)]


def weighted(rng, pairs):
    total = sum(weight for _, weight in pairs)
    pick = rng.uniform(0, total)
    for value, weight in pairs:
        pick -= weight
        if pick <= 0:
            return value
    return pairs[-1][0]


class Job:
    """One thing a client does: a request (good or bad) or a fault."""

    def __init__(self, kind, **fields):
        self.kind = kind  # the summary's name for it
        self.__dict__.update(fields)


def good_job(rng, prompts, token_prompts, max_n):
    chat = rng.random() < 0.45
    stream = rng.random() < 0.5
    policy = weighted(rng, POLICY_WEIGHTS)
    mode = weighted(rng, [("greedy", 60), ("seeded", 20), ("sampled", 20)])
    n = weighted(rng, [(1, 75), (2, 15), (min(3, max_n), 10)])
    prompt_index = rng.randrange(len(prompts))
    # A deterministic request's length goes with its prompt, so that the same requests recur and
    # the replay alone afterwards covers most of them.
    max_tokens = [4, 8, 12, 16][prompt_index % 4] if mode != "sampled" else rng.choice([4, 8, 16])
    body = {"max_tokens": max_tokens}
    if rng.random() < 0.3:
        body["model"] = MODEL_NAME[0]
    if chat:
        messages = []
        system = SYSTEM_PROMPTS[prompt_index % len(SYSTEM_PROMPTS)]
        if system:
            messages.append({"role": "system", "content": system})
        if prompt_index % 7 == 3:  # a multi-turn conversation, content as text parts
            messages.append({"role": "user", "content": [{"type": "text", "text": "Hello."}]})
            messages.append({"role": "assistant", "content": "Hi."})
        messages.append({"role": "user", "content": prompts[prompt_index]})
        body["messages"] = messages
        if rng.random() < 0.3:
            body["max_completion_tokens"] = body.pop("max_tokens")
    else:
        shape = weighted(rng, [("string", 78), ("ids", 11), ("batch", 11)])
        if shape == "string":
            body["prompt"] = prompts[prompt_index]
        elif shape == "ids":
            body["prompt"] = token_prompts[prompt_index % len(token_prompts)]
        else:
            body["prompt"] = [prompts[prompt_index], prompts[(prompt_index + 1) % len(prompts)]]
    if n > 1:
        body["n"] = n
    if policy is not None:
        body["kv_policy"] = policy
    if mode == "greedy":
        body["temperature"] = 0
    else:
        body["temperature"] = rng.choice([0.7, 1.0])
        body["top_p"] = rng.choice([1.0, 0.9])
        if rng.random() < 0.3:
            body["top_k"] = 40
        if mode == "seeded":
            body["seed"] = rng.randrange(4)
    if rng.random() < 0.1:
        body["stop"] = rng.choice([["the"], "\n", ["e", "zz"]])
    if rng.random() < 0.1:
        if chat:
            body["logprobs"] = True
            body["top_logprobs"] = 2
        else:
            body["logprobs"] = 2
    if rng.random() < 0.08:
        body["ignore_eos"] = True
    if stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    unknown = rng.random() < 0.1  # unknown fields are ignored (vLLM), null means unset
    if unknown:
        body["user"] = "soak"
        body["x_soak_unknown"] = {"nested": [1, "two", None]}
        body["response_format"] = None
    chunked = rng.random() < 0.08
    choices = n * (2 if isinstance(body.get("prompt"), list) and body["prompt"] and
                   isinstance(body["prompt"][0], str) else 1)
    deterministic = mode in ("greedy", "seeded")
    return Job("chunked_body" if chunked else ("chat" if chat else "completion") +
               ("_stream" if stream else ""),
               good=True, path="/v1/chat/completions" if chat else "/v1/completions",
               body=body, chunked=chunked, stream=stream, choices=choices,
               max_tokens=max_tokens, policy=policy, mode=mode,
               deterministic=deterministic,
               dense=policy in DENSE_POLICIES)


def replay_body(job):
    """The request to send alone afterwards: the body minus what does not change the text (and
    minus n for a greedy one, whose choices are all the one greedy answer)."""
    drop = {"stream", "stream_options", "logprobs", "top_logprobs", "user", "x_soak_unknown",
            "response_format", "model"}
    if job.mode == "greedy":
        drop.add("n")
    body = {key: value for key, value in job.body.items() if key not in drop}
    if "max_completion_tokens" in body:  # the same thing as max_tokens
        body["max_tokens"] = body.pop("max_completion_tokens")
    return body


def replay_key(job):
    return job.path, json.dumps(replay_body(job), sort_keys=True)


def same_answer(alone, results, n):
    """Whether an answer under load is the one alone; a greedy answer alone has one choice per
    prompt where the loaded one has n (n = 1 otherwise)."""
    return len(results) == len(alone) * n and all(
        result == alone[index // n] for index, result in enumerate(results))


# (path, body, expected status, expected "param" or None): requests the server must refuse.
def bad_requests(max_model_len, max_n, max_body):
    long_text = " ".join(WORDS[i % len(WORDS)] for i in range(2 * max_model_len + 50))
    long_ids = [2 + (i * 37) % 4000 for i in range(max_model_len + 8)]
    cmpl, chat = "/v1/completions", "/v1/chat/completions"
    user = [{"role": "user", "content": "hi"}]
    cases = [
        (cmpl, '{"prompt": "hi", "max_tokens": 8', 400, None),  # truncated JSON
        (cmpl, '{"prompt": "hi" "max_tokens": 8}', 400, None),
        (cmpl, "", 400, None),
        (cmpl, "[1, 2, 3]", 400, None),
        (cmpl, '"a string"', 400, None),
        (cmpl, '{"prompt": "hi", "max_tokens": "8"}', 400, "max_tokens"),
        (cmpl, '{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
        (cmpl, '{"prompt": "hi", "max_tokens": 8.5}', 400, "max_tokens"),
        (cmpl, '{"prompt": 5}', 400, "prompt"),
        (cmpl, '{"prompt": [99999999]}', 400, "prompt"),
        (cmpl, '{"prompt": "hi", "temperature": "hot"}', 400, "temperature"),
        (cmpl, '{"prompt": "hi", "temperature": -1}', 400, "temperature"),
        (cmpl, '{"prompt": "hi", "top_p": 2}', 400, "top_p"),
        (cmpl, '{"prompt": "hi", "top_k": -5}', 400, "top_k"),
        (cmpl, '{"prompt": "hi", "n": 0}', 400, "n"),
        (cmpl, json.dumps({"prompt": "hi", "n": max_n + 1}), 400, "n"),
        (cmpl, '{"prompt": "hi", "stream": "yes"}', 400, "stream"),
        (cmpl, '{"prompt": "hi", "stream_options": {"include_usage": true}}', 400,
         "stream_options"),
        (cmpl, '{"prompt": "hi", "seed": "x"}', 400, "seed"),
        (cmpl, '{"prompt": "hi", "stop": 5}', 400, "stop"),
        (cmpl, '{"prompt": "hi", "stop": [""]}', 400, "stop"),
        (cmpl, '{"prompt": "hi", "logit_bias": {"5": 1}}', 400, "logit_bias"),
        (cmpl, '{"prompt": "hi", "echo": "yes"}', 400, "echo"),
        (cmpl, '{"prompt": "hi", "best_of": 3}', 400, "best_of"),
        (cmpl, '{"prompt": "hi", "min_tokens": 2}', 400, "min_tokens"),
        (cmpl, '{"prompt": "hi", "logprobs": 99}', 400, "logprobs"),
        (cmpl, '{"prompt": "hi", "kv_policy": 7}', 400, "kv_policy"),
        (cmpl, '{"prompt": "hi", "kv_policy": "bogus"}', 400, None),
        (cmpl, '{"prompt": "hi", "kv_policy": "snapkv:0-3"}', 400, None),
        (cmpl, '{"prompt": "hi", "model": "no-such-model"}', 404, "model"),
        (cmpl, json.dumps({"prompt": long_text, "max_tokens": 4}), 400, "prompt"),
        (cmpl, json.dumps({"prompt": long_ids, "max_tokens": 4}), 400, "prompt"),
        (cmpl, json.dumps({"prompt": "hi", "max_tokens": max_model_len}), 400, "max_tokens"),
        (chat, '{"messages": "hi"}', 400, "messages"),
        (chat, '{"messages": []}', 400, "messages"),
        (chat, '{"messages": [{"role": "robot", "content": "x"}]}', 400, None),
        (chat, '{"messages": [{"role": "user", "content": 5}]}', 400, None),
        (chat, json.dumps({"messages": user, "top_logprobs": 2}), 400, "top_logprobs"),
        (chat, json.dumps({"messages": user, "max_completion_tokens": -1}), 400,
         "max_completion_tokens"),
        (chat, json.dumps({"messages": [{"role": "user", "content": long_text}]}), 400,
         "messages"),
        (chat, json.dumps({"messages": user, "stream": True, "n": 0}), 400, "n"),
        (chat, json.dumps({"messages": user, "stream": True, "kv_policy": "bogus"}), 400, None),
        (chat, json.dumps({"messages": user, "model": "nope"}), 404, "model"),
    ]
    return [(path, body.encode(), status, param) for path, body, status, param in cases] + [
        (cmpl, b'{"prompt": "\xff\xfe bad utf-8"}', 400, None),
        (cmpl, b'{"prompt": ' + b"[" * 20000 + b"]" * 20000 + b"}", 400, "prompt"),  # deep
        (cmpl, b'{"prompt": "' + b"a" * (max_body + 1000) + b'"}', 413, None),
    ]


# Raw HTTP faults: (name, bytes to send, expected status or None for "no response").
def raw_faults(max_body):
    good = b'{"prompt": "hi", "max_tokens": 2, "temperature": 0}'
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
    return [
        ("bad_chunk_size", (head + "Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n")
         .encode(), 400),
        ("chunked_over_limit", head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" +
         b"".join(b"8000\r\n" + b" " * 0x8000 + b"\r\n" for _ in range(max_body // 0x8000 + 2)) +
         b"0\r\n\r\n", 413),
        ("te_not_chunked", (head + "Transfer-Encoding: chunked, identity\r\n\r\n").encode() +
         good, 400),
        ("cl_and_te", (head + f"Content-Length: {len(good)}\r\nTransfer-Encoding: chunked\r\n\r\n")
         .encode() + good, 400),
        ("bad_request_line", b"HELLO WORLD\r\n\r\n", 400),
        ("bad_header", (head + "No colon here\r\n\r\n").encode(), 400),
        ("get_on_post_route", f"GET /v1/completions HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode(),
         405),
        ("unknown_route", (f"POST /v1/nothing HTTP/1.1\r\nHost: {HOST}\r\n"
                           "Content-Length: 2\r\n\r\n{}").encode(), 404),
        # The body ends early and the client half-closes: nothing can be answered.
        ("truncated_body", (head + f"Content-Length: {len(good) + 40}\r\n\r\n").encode() + good,
         None),
        ("truncated_header", head.encode()[:40], None),
    ]


# ---------------------------------------------------------------------------------------------
# Checking answers.


class Failure(Exception):
    pass


def check_error_body(response, expected_status, expected_param, what):
    if response.status != expected_status:
        raise Failure(f"{what}: status {response.status}, want {expected_status}: "
                      f"{response.body[:300]!r}")
    if not response.headers.get("content-type", "").startswith("application/json"):
        raise Failure(f"{what}: error Content-Type {response.headers.get('content-type')!r}")
    try:
        error = json.loads(response.body)["error"]
    except (ValueError, KeyError, TypeError):
        raise Failure(f"{what}: error body is not OpenAI's shape: {response.body[:300]!r}") \
            from None
    if not (isinstance(error, dict) and isinstance(error.get("message"), str) and
            error["message"] and isinstance(error.get("type"), str) and "param" in error and
            "code" in error):
        raise Failure(f"{what}: error body is not OpenAI's shape: {response.body[:300]!r}")
    if expected_param is not None and error["param"] != expected_param:
        raise Failure(f"{what}: error param {error['param']!r}, want {expected_param!r} "
                      f"({error['message']})")


def check_usage(usage, job, finish_reasons, what):
    if not isinstance(usage, dict):
        raise Failure(f"{what}: usage {usage!r}")
    prompt, completion, total = (usage.get("prompt_tokens"), usage.get("completion_tokens"),
                                 usage.get("total_tokens"))
    if not (isinstance(prompt, int) and prompt > 0 and isinstance(completion, int) and
            total == prompt + completion):
        raise Failure(f"{what}: bad usage {usage}")
    if completion > job.choices * job.max_tokens:
        raise Failure(f"{what}: {completion} completion tokens for {job.choices} choice(s) of at "
                      f"most {job.max_tokens}")
    if all(reason == "length" for reason in finish_reasons) and \
            completion != job.choices * job.max_tokens:
        raise Failure(f"{what}: every choice ended by length but usage says {completion} "
                      f"completion tokens, want {job.choices * job.max_tokens}")


def check_plain(response, job):
    """A non-streamed answer: returns [(text, finish_reason)] by choice index."""
    what = f"{job.kind} {job.path}"
    if response.status != 200:
        raise Failure(f"{what}: status {response.status}: {response.body[:300]!r} "
                      f"(request {json.dumps(job.body)[:300]})")
    try:
        answer = json.loads(response.body)
    except ValueError:
        raise Failure(f"{what}: body is not JSON: {response.body[:300]!r}") from None
    chat = job.path.endswith("chat/completions")
    want_object = "chat.completion" if chat else "text_completion"
    if answer.get("object") != want_object or not isinstance(answer.get("choices"), list):
        raise Failure(f"{what}: not a {want_object}: {response.body[:300]!r}")
    choices = sorted(answer["choices"], key=lambda choice: choice.get("index", -1))
    if [choice.get("index") for choice in choices] != list(range(job.choices)):
        raise Failure(f"{what}: choice indices {[c.get('index') for c in choices]}, want "
                      f"0..{job.choices - 1}")
    results = []
    for choice in choices:
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise Failure(f"{what}: finish_reason {reason!r}")
        text = choice.get("message", {}).get("content") if chat else choice.get("text")
        if chat and choice.get("message", {}).get("role") != "assistant":
            raise Failure(f"{what}: message {choice.get('message')!r}")
        if not isinstance(text, str):
            raise Failure(f"{what}: text {text!r}")
        results.append((text, reason))
    check_usage(answer.get("usage"), job, [reason for _, reason in results], what)
    return results


def sse_events(connection, response, limit=None):
    """Yields the data of each SSE event of a chunked event-stream response."""
    buffer = b""
    count = 0
    for piece in connection.chunks(response):
        buffer += piece
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if not event.startswith(b"data: ") or b"\n" in event:
                raise Failure(f"bad SSE event {event[:200]!r}")
            yield event[6:]
            count += 1
            if limit is not None and count >= limit:
                return
    if buffer:
        raise Failure(f"the stream ended inside an event: {buffer[:200]!r}")


def check_stream(connection, response, job):
    what = f"{job.kind} {job.path}"
    if response.status != 200:
        body = b"".join(connection.chunks(response))
        raise Failure(f"{what}: status {response.status}: {body[:300]!r}")
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        raise Failure(f"{what}: Content-Type {response.headers.get('content-type')!r}")
    if response.headers.get("transfer-encoding", "").lower() != "chunked":
        raise Failure(f"{what}: a stream that is not chunked")
    chat = job.path.endswith("chat/completions")
    want_object = "chat.completion.chunk" if chat else "text_completion"
    include_usage = bool(job.body.get("stream_options", {}).get("include_usage"))
    texts = collections.defaultdict(str)
    reasons = {}
    roles = set()
    usage = None
    done = False
    for data in sse_events(connection, response):
        if done:
            raise Failure(f"{what}: an event after [DONE]: {data[:200]!r}")
        if data == b"[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            raise Failure(f"{what}: event is not JSON: {data[:200]!r}") from None
        if chunk.get("object") != want_object or not isinstance(chunk.get("choices"), list):
            raise Failure(f"{what}: not a {want_object}: {data[:200]!r}")
        if usage is not None:
            raise Failure(f"{what}: a chunk after the usage chunk")
        if include_usage:
            if "usage" not in chunk:
                raise Failure(f"{what}: include_usage but a chunk without 'usage'")
            if chunk["usage"] is not None:
                if chunk["choices"]:
                    raise Failure(f"{what}: the usage chunk has choices")
                usage = chunk["usage"]
        elif "usage" in chunk and chunk["usage"] is not None:
            raise Failure(f"{what}: usage without include_usage")
        for choice in chunk["choices"]:
            index = choice.get("index")
            if not isinstance(index, int) or not 0 <= index < job.choices:
                raise Failure(f"{what}: choice index {index!r}")
            if index in reasons:
                raise Failure(f"{what}: choice {index} has a chunk after its finish_reason")
            if chat:
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    raise Failure(f"{what}: delta {delta!r}")
                if "role" in delta:
                    roles.add(index)
                text = delta.get("content", "")
            else:
                text = choice.get("text")
            if not isinstance(text, str):
                raise Failure(f"{what}: text {text!r}")
            texts[index] += text
            if choice.get("finish_reason") is not None:
                if choice["finish_reason"] not in ("stop", "length"):
                    raise Failure(f"{what}: finish_reason {choice['finish_reason']!r}")
                reasons[index] = choice["finish_reason"]
    if not done:
        raise Failure(f"{what}: the stream ended without data: [DONE]")
    if sorted(reasons) != list(range(job.choices)):
        raise Failure(f"{what}: finish_reason for choices {sorted(reasons)}, want "
                      f"0..{job.choices - 1}")
    if chat and sorted(roles) != list(range(job.choices)):
        raise Failure(f"{what}: role chunks for choices {sorted(roles)}")
    results = [(texts[index], reasons[index]) for index in range(job.choices)]
    if include_usage:
        if usage is None:
            raise Failure(f"{what}: include_usage but no usage chunk")
        check_usage(usage, job, [reason for _, reason in results], what)
    return results


# ---------------------------------------------------------------------------------------------
# The run.


class Soak:
    def __init__(self, args, port, server):
        self.args = args
        self.port = port
        self.server = server
        self.lock = threading.Lock()
        self.counts = collections.Counter()        # job kind -> jobs run
        self.statuses = collections.Counter()      # HTTP status (or "none") -> count
        self.failures = []
        self.observed = collections.defaultdict(list)  # replay key -> [(results, job kind)]
        self.key_jobs = {}
        self.choice_mismatches = collections.Counter()  # greedy n > 1 answers whose choices differ
        self.policies = collections.Counter()  # good requests by kv_policy
        self.cancelled_choices = 0  # engine requests of the clients that left early
        self.next_job = 0
        self.stop_issuing = False
        self.rss = []  # (seconds since the load began, kB)
        self.metric_samples = []
        self.server_died = None
        prompts_rng = random.Random(args.seed)
        self.prompts = make_prompts(24, args.seed)
        self.token_prompts = [[prompts_rng.randrange(2, 8000) for _ in range(prompts_rng.randint(
            4, 30))] for _ in range(8)]
        self.bad = bad_requests(args.max_model_len, args.max_n, args.max_body_bytes)
        self.raw = raw_faults(args.max_body_bytes)

    # --- bookkeeping
    def fail(self, message):
        with self.lock:
            self.failures.append(message)
        if self.args.verbose:
            print(f"FAIL {message}", flush=True)

    def count(self, kind, status):
        with self.lock:
            self.counts[kind] += 1
            self.statuses[str(status)] += 1

    # --- jobs
    def make_job(self, index):
        rng = random.Random(self.args.seed * 1000003 + index)
        kind = weighted(rng, [("good", 64), ("pipelined", 2), ("cancel_stream", 8),
                              ("disconnect_wait", 5), ("bad_body", 16), ("raw_fault", 5)])
        if kind == "good":
            return good_job(rng, self.prompts, self.token_prompts, self.args.max_n)
        if kind == "pipelined":  # two requests in one write: answered in order
            pair = []
            while len(pair) < 2:
                job = good_job(rng, self.prompts, self.token_prompts, self.args.max_n)
                if not job.stream and not job.chunked:
                    job.kind = "pipelined"
                    pair.append(job)
            return Job("pipelined", pair=pair)
        if kind in ("cancel_stream", "disconnect_wait"):
            chat = rng.random() < 0.4
            body = {"max_tokens": 48, "ignore_eos": True, "temperature": rng.choice([0, 1.0])}
            if chat:
                body["messages"] = [{"role": "user", "content": rng.choice(self.prompts)}]
            else:
                body["prompt"] = rng.choice(self.prompts)
            if rng.random() < 0.3:
                body["n"] = 2
            if rng.random() < 0.3:
                body["kv_policy"] = rng.choice(["snapkv", "h2o", "streamingllm"])
            if kind == "cancel_stream":
                body["stream"] = True
            return Job(kind, path="/v1/chat/completions" if chat else "/v1/completions",
                       body=body, events=rng.randint(1, 4), reset=rng.random() < 0.4,
                       wait=rng.uniform(0.0, 0.3))
        if kind == "bad_body":
            path, body, status, param = rng.choice(self.bad)
            return Job(f"bad_{status}", path=path, raw_body=body, status=status, param=param,
                       chunked=rng.random() < 0.1 and status != 413)
        name, data, status = rng.choice(self.raw)
        return Job(f"raw_{name}", data=data, status=status)

    def run_job(self, client, job):
        if getattr(job, "good", False):
            return self.run_good(client, job)
        if job.kind == "pipelined":
            return self.run_pipelined(client, job)
        if job.kind in ("cancel_stream", "disconnect_wait"):
            return self.run_cancel(job)
        if job.kind.startswith("bad_"):
            return self.run_bad(client, job)
        return self.run_raw(job)

    def exchange(self, client, data, what):
        """Sends on the client's keep-alive connection and reads the head of the answer."""
        connection = client.get()
        try:
            connection.send(data)
            return connection, connection.read_head()
        except (ConnectionClosed, ProtocolError, OSError) as error:
            client.drop()
            raise Failure(f"{what}: {type(error).__name__}: {error} (on a keep-alive "
                          f"connection that had served {client.served} request(s))") from None

    def run_good(self, client, job):
        data = build_request("POST", job.path, json.dumps(job.body).encode(), job.chunked)
        connection, response = self.exchange(client, data, f"{job.kind} {job.path}")
        try:
            if job.stream:
                results = check_stream(connection, response, job)
            else:
                response.body = b"".join(connection.chunks(response))
                results = check_plain(response, job)
        except (ProtocolError, OSError, ConnectionClosed) as error:
            client.drop()
            raise Failure(f"{job.kind}: reading the answer: {type(error).__name__}: {error}") \
                from None
        except Failure:
            client.drop()
            raise
        client.done(response)
        self.count(job.kind, response.status)
        self.record(job, results)

    def run_pipelined(self, client, job):
        first, second = job.pair
        data = b"".join(build_request("POST", one.path, json.dumps(one.body).encode())
                        for one in job.pair)
        connection, response = self.exchange(client, data, "pipelined")
        try:
            response.body = b"".join(connection.chunks(response))
            first_results = check_plain(response, first)
            self.count(job.kind, response.status)
            if not response.keep_alive():
                raise Failure("pipelined: the first answer closes the connection")
            response = connection.read_response()
            second_results = check_plain(response, second)
        except (ProtocolError, OSError, ConnectionClosed) as error:
            client.drop()
            raise Failure(f"pipelined: {type(error).__name__}: {error}") from None
        except Failure:
            client.drop()
            raise
        client.done(response)
        self.count(job.kind, response.status)
        self.record(first, first_results)
        self.record(second, second_results)

    def record(self, job, results):
        n = job.body.get("n", 1)
        if n > 1 and job.mode == "greedy":  # a prompt's n greedy choices are one answer n times
            for first in range(0, job.choices, n):
                if len(set(results[first:first + n])) != 1:
                    if self.args.greedy_check == "strict":
                        raise Failure(f"{job.kind}: the greedy choices of one prompt differ: "
                                      f"{results[first:first + n]} (request "
                                      f"{json.dumps(job.body)[:300]})")
                    with self.lock:
                        self.choice_mismatches["dense" if job.dense else "sparse"] += 1
        with self.lock:
            self.policies[job.body.get("kv_policy", "(server default)")] += 1
        if job.deterministic:
            key = replay_key(job)
            greedy_n = job.body.get("n", 1) if job.mode == "greedy" else 1
            with self.lock:
                self.observed[key].append((results, greedy_n, job.kind))
                self.key_jobs.setdefault(key, job)

    def run_bad(self, client, job):
        data = build_request("POST", job.path, job.raw_body, job.chunked)
        what = f"{job.kind} {job.path} {job.raw_body[:120]!r}"
        if job.status == 413:
            # Refused before the body is read: a fresh connection, closed by the server.
            connection = Connection(self.port, self.args.request_timeout)
            try:
                try:
                    connection.send(data)
                except OSError:
                    pass  # the server may answer and close before the body is all sent
                response = connection.read_response()
            except (ConnectionClosed, ProtocolError, OSError) as error:
                raise Failure(f"{what}: {type(error).__name__}: {error}") from None
            finally:
                connection.close()
        else:
            connection, response = self.exchange(client, data, what)
            try:
                response.body = b"".join(connection.chunks(response))
            except (ProtocolError, OSError) as error:
                client.drop()
                raise Failure(f"{what}: {error}") from None
            client.done(response)
        self.count(job.kind, response.status)
        check_error_body(response, job.status, job.param, what)

    def run_raw(self, job):
        connection = Connection(self.port, self.args.request_timeout)
        try:
            try:
                connection.send(job.data)
                if job.status is None:
                    connection.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            try:
                response = connection.read_response()
            except ConnectionClosed:
                response = None
            except (ProtocolError, OSError) as error:
                if job.status is None and isinstance(error, ConnectionResetError):
                    response = None
                else:
                    raise Failure(f"{job.kind}: {type(error).__name__}: {error}") from None
        finally:
            connection.close()
        if response is None:
            self.count(job.kind, "none")
            if job.status is not None:
                raise Failure(f"{job.kind}: no response, want {job.status}")
            return
        self.count(job.kind, response.status)
        if job.status is None:
            if response.status >= 500 or response.status < 400:
                raise Failure(f"{job.kind}: status {response.status}, want no answer or a 4xx")
            check_error_body(response, response.status, None, job.kind)
            return
        check_error_body(response, job.status, None, job.kind)

    def run_cancel(self, job):
        with self.lock:
            self.cancelled_choices += job.body.get("n", 1)
        connection = Connection(self.port, self.args.request_timeout)
        try:
            connection.send(build_request("POST", job.path, json.dumps(job.body).encode()))
            if job.kind == "disconnect_wait":
                time.sleep(job.wait)
                self.count(job.kind, "left")
                return
            response = connection.read_head()
            if response.status != 200:
                raise Failure(f"cancel_stream: status {response.status}")
            for _ in sse_events(connection, response, limit=job.events):
                pass
            self.count(job.kind, response.status)
        except (ConnectionClosed, ProtocolError, OSError) as error:
            raise Failure(f"{job.kind}: {type(error).__name__}: {error}") from None
        finally:
            connection.close(reset=job.reset)

    # --- clients
    def worker(self):
        client = Client(self.port, self.args.request_timeout)
        while True:
            with self.lock:
                if self.stop_issuing or self.next_job >= self.args.requests or self.failures and \
                        self.args.fail_fast:
                    break
                index = self.next_job
                self.next_job += 1
            job = self.make_job(index)
            try:
                self.run_job(client, job)
                continue
            except Failure as error:
                message = f"job {index}: {error}"
            except Exception as error:  # a bug in the soak itself, or an unexpected socket error
                message = f"job {index} ({job.kind}): {type(error).__name__}: {error}"
                client.drop()
            if self.check_server_alive():
                self.count(job.kind, "failed")
                self.fail(message)
        client.drop()

    def check_server_alive(self):
        """False once the server has exited (then the load stops: nothing more to learn)."""
        if self.server.poll() is None:
            return True
        with self.lock:
            self.stop_issuing = True
            if self.server_died is None:
                self.server_died = f"the server exited with status {self.server.returncode} " \
                                   "during the load"
        return False

    def sampler(self, stop, start):
        """RSS every 0.25 s, /metrics every 2 s (a scrape under load), the server's liveness."""
        next_scrape = 0.0
        while not stop.wait(0.25):
            now = time.monotonic() - start
            if not self.check_server_alive():
                return
            rss = read_rss_kb(self.server.pid)
            if rss is not None:
                self.rss.append((now, rss))
            if now >= next_scrape:
                next_scrape = now + 2.0
                try:
                    metrics = scrape(self.port, self.args.request_timeout)
                    self.metric_samples.append((now, metrics))
                except Exception as error:
                    self.fail(f"GET /metrics under load: {type(error).__name__}: {error}")


class Client:
    """A client thread's keep-alive connection."""

    def __init__(self, port, timeout):
        self.port = port
        self.timeout = timeout
        self.connection = None
        self.served = 0

    def get(self):
        if self.connection is None:
            self.connection = Connection(self.port, self.timeout)
            self.served = 0
        return self.connection

    def done(self, response):
        self.served += 1
        if not response.keep_alive():
            self.drop()

    def drop(self):
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def read_rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def read_cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)
    except (OSError, IndexError, ValueError):
        return None


def http_get(port, path, timeout):
    connection = Connection(port, timeout)
    try:
        connection.send(build_request("GET", path, headers=["Connection: close"]))
        return connection.read_response()
    finally:
        connection.close()


METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def scrape(port, timeout):
    """GET /metrics as {(name, labels without model_name): value}."""
    response = http_get(port, "/metrics", timeout)
    if response.status != 200:
        raise Failure(f"/metrics answered {response.status}")
    metrics = {}
    for line in response.body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        match = METRIC_LINE.match(line)
        if not match:
            raise Failure(f"bad /metrics line {line!r}")
        labels = tuple(sorted(
            (key, value) for key, value in re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")
            if key != "model_name"))
        metrics[(match.group(1), labels)] = float(match.group(3))
    return metrics


def metric(metrics, name, **labels):
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def metric_sum(metrics, name, predicate=lambda labels: True):
    return sum(value for (key, labels), value in metrics.items()
               if key == name and predicate(dict(labels)))


def send_alone(port, job, timeout):
    """The job's request, not streamed, on a fresh connection: [(text, finish_reason)]."""
    body = replay_body(job)
    choices = job.choices // (job.body.get("n", 1) if job.mode == "greedy" else 1)
    replay = Job(job.kind, path=job.path, body=body, choices=choices, max_tokens=job.max_tokens)
    connection = Connection(port, timeout)
    try:
        connection.send(build_request("POST", job.path, json.dumps(body).encode()))
        return check_plain(connection.read_response(), replay)
    finally:
        connection.close()


# The server's flags the soak relies on (it builds requests from them): set by its own flags.
OWN_SERVE_FLAGS = {"--host", "--port", "--device", "--model", "--max-model-len", "--kv-memory",
                   "--kv-policy", "--max-body-bytes", "--max-n", "--chat-template",
                   "--http-threads", "--threads"}
# Defaults that arguments after -- may replace. Small budgets, so that the sparse policies drop
# entries from these short prompts (SnapKV/PyramidKV keep 24 of a longer prompt, StreamingLLM
# 4 + 12 and H2O 12 + 12 as they decode). At most 256 tokens a step: the per-step scratch reaches
# its high-water mark in the first seconds, so the RSS of the second half is flat unless
# something leaks (with 2,048 a rare large step grows it by ~3.5 MiB late in a run); it also
# chunks more prefills.
DEFAULT_SERVE_FLAGS = {"--kv-budget": "24", "--kv-window": "8", "--kv-sinks": "4",
                       "--kv-recent": "12", "--kv-heavy": "12", "--max-num-batched-tokens": "256",
                       "--shutdown-timeout": "5"}


def serve_flag_value(serve_args, flag):
    """The value the arguments after -- give `flag` (--flag VALUE or --flag=VALUE), or None."""
    value = None
    for index, arg in enumerate(serve_args):
        if arg == flag and index + 1 < len(serve_args):
            value = serve_args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def serve_command(args):
    command = [args.sieve, "serve", "--host", HOST, "--port", "0", "--device", args.device,
               "--max-model-len", str(args.max_model_len), "--kv-memory", args.kv_memory,
               "--kv-policy", args.server_kv_policy, "--max-body-bytes", str(args.max_body_bytes),
               "--max-n", str(args.max_n), "--http-threads", str(args.http_threads),
               "--chat-template", args.chat_template]
    if args.model:
        command += ["--model", args.model]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    given = {arg.split("=", 1)[0] for arg in args.serve_args if arg.startswith("--")}
    for flag, value in DEFAULT_SERVE_FLAGS.items():
        if flag not in given:
            command += [flag, value]
    return command + args.serve_args


def start_server(args):
    command = serve_command(args)
    log = open(args.log, "w+b") if args.log else tempfile.NamedTemporaryFile(
        prefix="sieve-soak-", suffix=".log", delete=False)
    print("server: " + " ".join(shlex.quote(part) for part in command), flush=True)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + args.startup_timeout
    port = None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        with open(log.name, "rb") as reader:
            match = re.search(rb"on http://[^ ]+:([0-9]+)", reader.read())
        if match:
            port = int(match.group(1))
            break
        time.sleep(0.1)
    return server, log.name, port


def stop_server(server, timeout=30):
    if server.poll() is not None:
        return server.returncode
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        return None


def tail(path, lines=40):
    try:
        with open(path, "rb") as reader:
            return b"\n".join(reader.read().splitlines()[-lines:]).decode("utf-8", "replace")
    except OSError:
        return ""


def rss_window(samples, begin, end):
    values = [kb for at, kb in samples if begin <= at <= end]
    return max(values) if values else None


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog="Arguments after -- go to `sieve serve`.")
    default_sieve = os.path.join(ROOT, "build", "release", "sieve")
    parser.add_argument("--sieve", default=default_sieve,
                        help="the sieve binary (default: %(default)s)")
    parser.add_argument("--model", help="model directory (default: sieve serve's default model)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default: cpu)")
    parser.add_argument("--threads", type=int, default=None,
                        help="server CPU threads (default: 2 on the CPU, the server's default "
                             "elsewhere)")
    parser.add_argument("--requests", type=int, default=1200,
                        help="requests and faults to send (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=0,
                        help="stop sending after this long even if --requests are not all sent "
                             "(0: no limit)")
    parser.add_argument("--clients", type=int, default=16, help="client threads (default: 16)")
    parser.add_argument("--kv-memory", default="3M",
                        help="the server's KV pool; small, so that requests are preempted "
                             "(default: %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=256,
                        help="the server's context length; longer prompts are refused "
                             "(default: %(default)s)")
    parser.add_argument("--server-kv-policy", default="h2o",
                        help="the server's --kv-policy, the default of requests without "
                             "kv_policy; it must evict during decode (h2o) for requests to ask "
                             "for streamingllm and h2o, which a server started with another "
                             "refuses (default: %(default)s)")
    parser.add_argument("--chat-template", default="llama3",
                        help="the server's --chat-template (the default model has none)")
    parser.add_argument("--max-body-bytes", type=int, default=65536,
                        help="the server's --max-body-bytes; larger bodies are sent to get 413 "
                             "(default: %(default)s)")
    parser.add_argument("--max-n", type=int, default=4,
                        help="the server's --max-n; n past it is sent to get 400 "
                             "(default: %(default)s)")
    parser.add_argument("--http-threads", type=int, default=2,
                        help="the server's --http-threads (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the request mix")
    parser.add_argument("--request-timeout", type=float, default=120,
                        help="seconds one request may take before the run fails (a hang)")
    parser.add_argument("--startup-timeout", type=float, default=180,
                        help="seconds the server may take to load and listen "
                             "(default: %(default)s)")
    parser.add_argument("--replay-max", type=int, default=200,
                        help="most distinct dense deterministic requests replayed alone "
                             "(default: %(default)s)")
    parser.add_argument("--replay-sparse", type=int, default=16,
                        help="distinct sparse deterministic requests replayed alone, each twice "
                             "(default: %(default)s)")
    parser.add_argument("--greedy-check", choices=["strict", "report"], default=None,
                        help="strict: a greedy or seeded answer under load that differs "
                             "from the one alone fails the run; report: counted only "
                             "(default: strict on the CPU, whose ops are batch-invariant, and "
                             "with `-- --batch-invariant`; report elsewhere)")
    parser.add_argument("--rss-limit-mib", type=float, default=None,
                        help="most RSS growth over the second half of the load, MiB (default: "
                             "the larger of 4 MiB and 5%% of the RSS at its start)")
    parser.add_argument("--no-rss-check", action="store_true",
                        help="report the RSS without checking it (sanitizer builds)")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failure")
    parser.add_argument("--log", help="the server's log file (default: a temporary file, kept "
                                      "when the run fails)")
    parser.add_argument("--result-json", help="write the summary here as JSON")
    parser.add_argument("--verbose", action="store_true", help="print failures as they happen")
    args, rest = parser.parse_known_args()
    if rest and rest[0] == "--":
        rest = rest[1:]
    elif rest:
        parser.error(f"unknown arguments {rest} (arguments for sieve serve go after --)")
    args.serve_args = rest
    clash = sorted({arg.split("=", 1)[0] for arg in rest} & OWN_SERVE_FLAGS)
    if clash:
        parser.error(f"{', '.join(clash)}: set with the soak's own flags, not after --")
    if args.threads is None and args.device == "cpu":
        args.threads = 2
    if args.greedy_check is None:
        invariant = "--batch-invariant" in args.serve_args
        args.greedy_check = "strict" if args.device == "cpu" or invariant else "report"
    if not os.access(args.sieve, os.X_OK):
        print(f"soak: {args.sieve} is not an executable (build it, or pass --sieve)",
              file=sys.stderr)
        return 2

    wall_start = time.monotonic()
    server, log_path, port = start_server(args)
    if port is None:
        print(f"soak: sieve serve did not start:\n{tail(log_path)}", file=sys.stderr)
        stop_server(server, 5)
        return 2
    try:
        return run(args, server, port, log_path, wall_start)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def run(args, server, port, log_path, wall_start):
    summary = {"command": sys.argv, "server_pid": server.pid, "server_log": log_path}
    models = json.loads(http_get(port, "/v1/models", 30).body)
    MODEL_NAME[0] = models["data"][0]["id"]
    before = scrape(port, 30)
    summary["kv_pages_total"] = metric(before, "sieve:kv_cache_pages_total")
    print(f"serving {MODEL_NAME[0]} on port {port}, pid {server.pid}, "
          f"{summary['kv_pages_total']:.0f} KV pages; {args.requests} requests from "
          f"{args.clients} clients", flush=True)

    soak = Soak(args, port, server)
    load_start = time.monotonic()
    stop_sampling = threading.Event()
    sampler = threading.Thread(target=soak.sampler, args=(stop_sampling, load_start), daemon=True)
    sampler.start()
    deadline = None if args.seconds <= 0 else load_start + args.seconds
    workers = [threading.Thread(target=soak.worker, daemon=True) for _ in range(args.clients)]
    for worker in workers:
        worker.start()
    last_report = load_start
    while any(worker.is_alive() for worker in workers):
        time.sleep(0.2)
        now = time.monotonic()
        if deadline is not None and now >= deadline and not soak.stop_issuing:
            with soak.lock:
                soak.stop_issuing = True
        if now - last_report >= 15:
            last_report = now
            with soak.lock:
                done = sum(soak.counts.values())
            print(f"  {now - load_start:5.0f} s: {done} done, {len(soak.failures)} failure(s), "
                  f"RSS {soak.rss[-1][1] / 1024 if soak.rss else 0:.1f} MiB", flush=True)
    load_seconds = time.monotonic() - load_start
    stop_sampling.set()
    sampler.join()
    failures = soak.failures
    if soak.server_died:
        failures.insert(0, f"{soak.server_died} (its log: {log_path})")

    # Every page free once the clients are gone (aborts land on the engine's next turn).
    final = None
    if server.poll() is None:
        settle_deadline = time.monotonic() + 30
        while True:
            final = scrape(port, 30)
            busy = (metric(final, "sieve:kv_cache_pages_used"),
                    metric(final, "sieve:num_requests_running"),
                    metric(final, "sieve:num_requests_waiting"),
                    metric_sum(final, "sieve:kv_cache_pages_used_by_layer"))
            if busy == (0, 0, 0, 0) or time.monotonic() > settle_deadline:
                break
            time.sleep(0.2)
        if busy != (0, 0, 0, 0):
            failures.append(f"30 s after the load: {busy[0]:.0f} KV pages used "
                            f"({busy[3]:.0f} by layer), {busy[1]:.0f} running, {busy[2]:.0f} "
                            "waiting: pages leaked or requests stuck")
    rss_after_load = read_rss_kb(server.pid)

    # Deterministic answers under load against the same request alone.
    replay = {"dense_keys": 0, "dense_mismatches": 0, "sparse_keys": 0, "sparse_mismatches": 0,
              "sparse_nondeterministic": 0, "answers_compared": 0, "examples": [],
              "dense_keys_seen": sum(1 for key in soak.observed if soak.key_jobs[key].dense),
              "sparse_keys_seen": sum(1 for key in soak.observed
                                      if not soak.key_jobs[key].dense)}
    if server.poll() is None:
        # The most often seen first; every dense one up to --replay-max, fewer sparse ones.
        keys = sorted(soak.observed, key=lambda key: (-len(soak.observed[key]), key))
        dense_keys = [key for key in keys if soak.key_jobs[key].dense][:args.replay_max]
        sparse_keys = [key for key in keys if not soak.key_jobs[key].dense]
        sparse_keys = sparse_keys[:args.replay_sparse]
        for key in dense_keys + sparse_keys:
            job = soak.key_jobs[key]
            try:
                alone = send_alone(port, job, args.request_timeout)
            except (Failure, OSError, ProtocolError, ConnectionClosed) as error:
                failures.append(f"replay of {key}: {error}")
                continue
            dense = job.dense
            group = "dense" if dense else "sparse"
            replay[f"{group}_keys"] += 1
            if not dense:
                again = send_alone(port, job, args.request_timeout)
                if again != alone:
                    replay["sparse_nondeterministic"] += 1
                    failures.append(f"{job.kind} {key[1][:200]}: two runs alone differ: "
                                    f"{alone} vs {again}")
            replay["answers_compared"] += len(soak.observed[key])
            differing = [(results, kind) for results, n, kind in soak.observed[key]
                         if not same_answer(alone, results, n)]
            if differing:
                replay[f"{group}_mismatches"] += 1
                example = (f"{key[0]} {key[1][:300]}: alone {alone}, under load ({len(differing)}"
                           f" of {len(soak.observed[key])}) {differing[0][0]} [{differing[0][1]}]")
                if len(replay["examples"]) < 5:
                    replay["examples"].append(example)
                if args.greedy_check == "strict":
                    failures.append("answer under load differs from the same request alone: " +
                                    example)
    after = scrape(port, 30) if server.poll() is None else final
    if after is not None and metric(after, "sieve:kv_cache_pages_used") != 0:
        failures.append(f"{metric(after, 'sieve:kv_cache_pages_used'):.0f} KV pages used after "
                        "the replay")

    # Server-side counts.
    if after is not None:
        server_5xx = metric_sum(after, "sieve:http_requests_total",
                                lambda labels: labels.get("status", "").startswith("5"))
        if server_5xx:
            failures.append(f"sieve:http_requests_total counts {server_5xx:.0f} 5xx responses")
        preemptions = metric(after, "sieve:num_preemptions_total")
        aborted = metric(after, "sieve:num_requests_aborted_total")
        if preemptions <= 0:
            failures.append("no request was preempted (sieve:num_preemptions_total is 0): lower "
                            "--kv-memory or raise --clients")
        if aborted <= 0:
            failures.append("no request was aborted (sieve:num_requests_aborted_total is 0): the "
                            "cancellations did not reach the engine")
        # Prefix caching (on unless the serve arguments turn it off): the replays send prompts
        # seen under load again, and each sparse one twice in a row, so some must hit; their
        # answers are checked above like every other. Not with --batch-invariant, which uses a
        # cached prefix only in whole prefill chunks of 256 tokens (sched/README.md): the soak's
        # prompts, at most --max-model-len 256, never hold one.
        cache_hits = metric(after, "vllm:prefix_cache_hits_total")
        cache_queries = metric(after, "vllm:prefix_cache_queries_total")
        if ("--no-enable-prefix-caching" not in args.serve_args and
                "--batch-invariant" not in args.serve_args and cache_hits <= 0):
            failures.append("no prompt token was found in the prefix cache "
                            "(vllm:prefix_cache_hits_total is 0), replays included")
        # Preemption by swap (serve arguments `--preemption-mode swap`): the preemptions must be
        # swaps (the default --swap-space holds this model's whole pool many times over, so none
        # falls back to recompute), no sparse request replays its tokens, and none is left
        # swapped out.
        swapped_out = metric(after, "sieve:num_swapped_out_total")
        swapped_in = metric(after, "sieve:num_swapped_in_total")
        swap_fallbacks = metric(after, "sieve:num_swap_fallbacks_total")
        replayed = metric(after, "sieve:num_replayed_tokens_total")
        if serve_flag_value(args.serve_args, "--preemption-mode") == "swap":
            if swapped_out <= 0:
                failures.append("--preemption-mode swap: no request was swapped out "
                                "(sieve:num_swapped_out_total is 0)")
            if swap_fallbacks > 0 or replayed > 0:
                failures.append(f"--preemption-mode swap: {swap_fallbacks:.0f} preemptions fell "
                                f"back to recompute, {replayed:.0f} tokens replayed")
            if metric(after, "sieve:num_requests_swapped") != 0:
                failures.append(f"{metric(after, 'sieve:num_requests_swapped'):.0f} requests "
                                "still swapped out after the replay")
        summary["server"] = {
            "preemptions": preemptions,
            "swapped_out": swapped_out,
            "swapped_in": swapped_in,
            "swap_fallbacks": swap_fallbacks,
            "replayed_tokens": replayed,
            "aborted": aborted,
            "cancelled_by_clients": soak.cancelled_choices,
            "peak_pages_used": metric(after, "sieve:kv_cache_peak_pages_used"),
            "pages_used_at_end": metric(after, "sieve:kv_cache_pages_used"),
            "pages_total": metric(after, "sieve:kv_cache_pages_total"),
            "requests_finished": {reason: metric(after, "sieve:request_success_total",
                                                 finished_reason=reason)
                                  for reason in ("stop", "length", "abort")},
            "generation_tokens": metric(after, "sieve:generation_tokens_total"),
            "prompt_tokens": metric(after, "sieve:prompt_tokens_total"),
            "engine_steps": metric(after, "sieve:engine_steps_total"),
            "http_5xx": server_5xx,
            "prefix_cache_hits": cache_hits,
            "prefix_cache_queries": cache_queries,
        }

    # RSS over the second half of the load: the largest sample in its first eighth against the
    # largest in its last eighth (maxima, not single samples: the allocator's heap breathes with
    # the batch).
    rss = {"samples": len(soak.rss)}
    if soak.rss:
        half = load_seconds / 2
        eighth = load_seconds / 8
        rss_start = soak.rss[0][1]
        rss_mid = rss_window(soak.rss, half, half + eighth) or soak.rss[-1][1]
        rss_end = rss_window(soak.rss, load_seconds - eighth, load_seconds) or soak.rss[-1][1]
        rss_peak = max(kb for _, kb in soak.rss)
        limit_kb = (args.rss_limit_mib * 1024 if args.rss_limit_mib is not None
                    else max(4 * 1024, 0.05 * rss_mid))
        step = max(1, len(soak.rss) // 100)
        rss["series_s_kb"] = [[round(at, 1), kb] for at, kb in soak.rss[::step]]
        rss.update({"start_kb": rss_start, "second_half_start_kb": rss_mid,
                    "second_half_end_kb": rss_end, "peak_kb": rss_peak,
                    "after_load_kb": rss_after_load, "growth_kb": rss_end - rss_mid,
                    "limit_kb": limit_kb, "checked": not args.no_rss_check})
        if not args.no_rss_check and rss_end - rss_mid > limit_kb:
            failures.append(f"RSS grew by {(rss_end - rss_mid) / 1024:.1f} MiB over the second "
                            f"half of the load ({rss_mid / 1024:.1f} -> {rss_end / 1024:.1f} MiB; "
                            f"limit {limit_kb / 1024:.1f} MiB): a leak?")
        if len(soak.rss) < 8:
            failures.append(f"only {len(soak.rss)} RSS samples: the load was too short to judge")

    samples = [metrics for _, metrics in soak.metric_samples]
    summary["under_load"] = {
        "metrics_scrapes": len(samples),
        "max_running": max((metric(m, "sieve:num_requests_running") for m in samples), default=0),
        "max_waiting": max((metric(m, "sieve:num_requests_waiting") for m in samples), default=0),
        "max_pages_used": max((metric(m, "sieve:kv_cache_pages_used") for m in samples),
                              default=0)}
    summary["server_cpu_seconds"] = read_cpu_seconds(server.pid)
    summary["soak_cpu_seconds"] = round(sum(os.times()[:2]), 1)

    # SIGTERM: a clean exit.
    exit_status = stop_server(server)
    if not soak.server_died:
        if exit_status is None:
            failures.append("sieve serve did not exit within 30 s of SIGTERM")
        elif exit_status != 0:
            failures.append(f"sieve serve exited with status {exit_status} after SIGTERM")

    good = {kind: count for kind, count in soak.counts.items()
            if kind.startswith(("completion", "chat", "chunked_body", "pipelined"))}
    summary.update({
        "passed": not failures,
        "jobs": sum(soak.counts.values()),
        "good_requests": sum(good.values()),
        "faults": sum(soak.counts.values()) - sum(good.values()),
        "by_kind": dict(sorted(soak.counts.items())),
        "statuses": dict(sorted(soak.statuses.items())),
        "failures": len(failures),
        "failure_messages": failures[:50],
        "replay": replay,
        "greedy_choice_mismatches": dict(soak.choice_mismatches),
        "good_by_policy": {str(k): v for k, v in sorted(soak.policies.items(), key=str)},
        "rss": rss,
        "load_seconds": round(load_seconds, 1),
        "wall_seconds": round(time.monotonic() - wall_start, 1),
        "server_exit_status": exit_status,
    })
    print_summary(summary)
    if args.result_json:
        with open(args.result_json, "w") as out:
            json.dump(summary, out, indent=2)
            out.write("\n")
    if failures:
        print(f"\nserver log: {log_path}; its end:\n{tail(log_path)}")
        return 1
    if not args.log:
        os.unlink(log_path)
    return 0


def print_summary(summary):
    print(f"\nsoak: {summary['jobs']} requests in {summary['load_seconds']} s "
          f"({summary['good_requests']} good, {summary['faults']} faults), wall "
          f"{summary['wall_seconds']} s; CPU: server {summary['server_cpu_seconds']} s, soak "
          f"{summary['soak_cpu_seconds']} s")
    print("  by kind:  " + ", ".join(f"{k} {v}" for k, v in summary["by_kind"].items()))
    print("  statuses: " + ", ".join(f"{k} {v}" for k, v in summary["statuses"].items()))
    print("  policies: " + ", ".join(f"{k} {v}" for k, v in summary["good_by_policy"].items()))
    server = summary.get("server")
    if server:
        print(f"  server:   {server['preemptions']:.0f} preemptions ({server['swapped_out']:.0f} "
              f"swapped out, {server['swapped_in']:.0f} back in, {server['swap_fallbacks']:.0f} "
              f"swap fallbacks, {server['replayed_tokens']:.0f} tokens replayed), "
              f"{server['aborted']:.0f} "
              f"aborted (clients left {server['cancelled_by_clients']} early), KV pages "
              f"{server['pages_used_at_end']:.0f} used of "
              f"{server['pages_total']:.0f} at the end (peak {server['peak_pages_used']:.0f}), "
              f"{server['generation_tokens']:.0f} tokens generated in "
              f"{server['engine_steps']:.0f} steps, {server['http_5xx']:.0f} 5xx, "
              f"{server['prefix_cache_hits']:.0f} of {server['prefix_cache_queries']:.0f} "
              "prompt tokens looked up found in the prefix cache")
    load = summary["under_load"]
    print(f"  scrapes:  {load['metrics_scrapes']} of /metrics under load: up to "
          f"{load['max_running']:.0f} running, {load['max_waiting']:.0f} waiting, "
          f"{load['max_pages_used']:.0f} pages used")
    replay = summary["replay"]
    print(f"  replay:   {replay['answers_compared']} answers under load compared with "
          f"{replay['dense_keys'] + replay['sparse_keys']} requests alone: dense "
          f"{replay['dense_keys']} (of {replay['dense_keys_seen']} seen), "
          f"{replay['dense_mismatches']} differ; sparse {replay['sparse_keys']} (of "
          f"{replay['sparse_keys_seen']}), {replay['sparse_mismatches']} differ, "
          f"{replay['sparse_nondeterministic']} nondeterministic alone")
    mismatches = summary["greedy_choice_mismatches"]
    if mismatches:
        print(f"            greedy n > 1 answers whose choices differ: {mismatches}")
    for example in replay["examples"]:
        print(f"            e.g. {example[:400]}")
    rss = summary["rss"]
    if "start_kb" in rss:
        print(f"  RSS:      start {rss['start_kb'] / 1024:.1f} MiB, second half "
              f"{rss['second_half_start_kb'] / 1024:.1f} -> {rss['second_half_end_kb'] / 1024:.1f} "
              f"MiB (growth {rss['growth_kb'] / 1024:+.1f}, limit {rss['limit_kb'] / 1024:.1f}"
              f"{'' if rss['checked'] else ', not checked'}), peak {rss['peak_kb'] / 1024:.1f} "
              f"MiB, {rss['samples']} samples")
    print(f"  result:   {'PASS' if summary['passed'] else 'FAIL'}: {summary['failures']} "
          "failure(s)")
    for message in summary["failure_messages"][:20]:
        print(f"    - {message[:600]}")


if __name__ == "__main__":
    sys.exit(main())
