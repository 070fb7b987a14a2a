#!/usr/bin/env python3
"""lm-evaluation-harness's `local-completions` request shapes against `sieve serve` on the CPU
(docs/server.md, "Prompt logprobs (echo)").

The shapes are those of lm_eval/models/openai_completions.py: loglikelihood sends
{"prompt": [[ids...], ...], "echo": true, "max_tokens": 1, "logprobs": 1, "temperature": 0,
"seed": 1234} (older harnesses and other clients send max_tokens 0) and reads
token_logprobs[ctxlen:-1] (max_tokens 0: [ctxlen:]) and top_logprobs to decide is_greedy; its
remote tokenizer probes GET /tokenizer_info for "eos_token" and POST /tokenize, then uses
/tokenize and /detokenize.

Checks:
1. The sum of a text's prompt logprobs equals `sieve eval --task perplexity` on the same tokens
   (total NLL; the eval teacher-forces them through decode steps, the server scores them in its
   prefill, in chunks of at most 256 rows: the text is longer than one chunk).
2. max_tokens 0 and 1 give the same prompt logprobs; 1 adds the greedy token, whose logprob is
   its top logprob; greedy flags agree with greedy generation from the same prefixes.
3. Batches of token-id prompts come back one choice each, in order.
4. /tokenize, /detokenize round trip; /tokenizer_info has what the harness reads.
5. Bad input is a 400 with an OpenAI error body, and the server keeps serving.

Usage: lm_eval_replay_test.py SIEVE_BINARY SOURCE_DIR. Traffic goes to 127.0.0.1 only.
"""
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback_http import http_request  # noqa: E402

CONTEXT = 64  # the eval's --lengths: BOS + 63 tokens of context before the scored ones
# Total NLL, server prefill against the eval's decode steps: both fp32 on the CPU with the same
# weights, and equal to the last bit in the runs so far (915 tokens, two 256-row chunks and the
# rest); the bound leaves room for a backend whose prefill and decode attention sum in different
# orders, and is far below one token's NLL (~14 here).
NLL_RELATIVE_TOLERANCE = 1e-4
LOGPROB_TOLERANCE = 1e-3  # one token, prefill row against a decode step


class Failures:
    def __init__(self):
        self.items = []
        self.passed = 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
            print("ok   " + what)
        else:
            self.items.append(what)
            print("FAIL " + what)


def start(sieve, model, log_path):
    command = [sieve, "serve", "--host", "127.0.0.1", "--port", "0", "--device", "cpu",
               "--model", model, "--threads", "2", "--kv-memory", "256M", "--no-progress"]
    log = open(log_path, "wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        text = open(log_path, "rb").read()
        match = re.search(rb"on http://[^ ]+:([0-9]+)", text)
        if match and http_request(int(match.group(1)), "GET", "/health")[0] == 200:
            return server, int(match.group(1))
        time.sleep(0.2)
    raise SystemExit("FAIL: the server did not start:\n" + open(log_path).read()[-3000:])


def post(port, path, body, expect=200):
    status, _, text = http_request(port, "POST", path, body, timeout=300)
    if status != expect:
        raise SystemExit("FAIL: %s %s -> %d %s" % (path, json.dumps(body)[:200], status, text[:500]))
    return json.loads(text)


def dechunk(raw):
    """The body of a `Transfer-Encoding: chunked` answer (bytes, whose chunk sizes count them),
    as text."""
    out, rest = b"", raw
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out.decode("utf-8", "replace")


def harness_parse(choice, ctxlen, max_tokens):
    """lm-eval's parse_logprobs for one choice: (sum of continuation logprobs, is_greedy)."""
    end = -1 if max_tokens > 0 else None  # max_tokens 1: the last entry is the generated token
    token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:end]
    top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:end]
    is_greedy = all(tok == max(top.values()) for tok, top in zip(token_logprobs, top_logprobs))
    return sum(token_logprobs), is_greedy


def loglikelihood_payload(prompts, max_tokens):
    return {"model": "sieve-tiny-10m", "prompt": prompts, "temperature": 0,
            "max_tokens": max_tokens, "logprobs": 1, "seed": 1234, "echo": True}


def main():
    sieve, source_dir = sys.argv[1], sys.argv[2]
    model = os.path.join(source_dir, "models", "sieve-tiny-10m")
    seed = int(os.environ.get("SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print("seed %d (SEED=%d reproduces it)" % (seed, seed))
    f = Failures()
    with tempfile.TemporaryDirectory() as work:
        server, port = start(sieve, model, os.path.join(work, "serve.log"))
        try:
            # 4. The remote tokenizer as lm-eval probes and uses it.
            status, _, info = http_request(port, "GET", "/tokenizer_info")
            info = json.loads(info) if status == 200 else {}
            f.check(status == 200 and "eos_token" in info and "bos_token" in info,
                    "GET /tokenizer_info has eos_token and bos_token: %r" % info)
            words = open(os.path.join(source_dir, "docs", "server.md")).read().split()
            start_word = rng.randrange(0, len(words) - 400)
            text = " ".join(words[start_word:start_word + 300])
            plain = post(port, "/tokenize", {"prompt": text, "add_special_tokens": False})
            with_bos = post(port, "/tokenize", {"prompt": text})
            bos = with_bos["tokens"][:len(with_bos["tokens"]) - len(plain["tokens"])]
            f.check(plain["count"] == len(plain["tokens"]) and with_bos["tokens"][len(bos):] ==
                    plain["tokens"] and "max_model_len" in plain,
                    "/tokenize: %d tokens, BOS %r with add_special_tokens" % (plain["count"], bos))
            back = post(port, "/detokenize", {"tokens": plain["tokens"]})
            f.check(back["prompt"] == text, "/detokenize(/tokenize(text)) == text")
            tokens = plain["tokens"]
            ids = bos + tokens

            # 1. Prompt logprobs against sieve eval's perplexity on the same tokens: the text is
            # exactly one window (context + scored = its tokens), so the eval's window is all of
            # it whatever its seed.
            text_path = os.path.join(work, "text.txt")
            with open(text_path, "w") as out:
                out.write(text)
            scored = len(tokens) - (CONTEXT - len(bos))
            result_path = os.path.join(work, "eval.json")
            subprocess.run([sieve, "eval", "--device", "cpu", "--model", model, "--threads", "2",
                            "--task", "perplexity", "--lengths", str(CONTEXT), "--samples", "1",
                            "--ppl-tokens", str(scored), "--text", text_path, "--no-progress",
                            "--result-json", result_path], check=True,
                           stdout=subprocess.DEVNULL)
            records = [r for r in json.load(open(result_path))["records"]
                       if r["task"] == "perplexity"]
            eval_nll = records[0]["nll"]
            f.check(records[0]["scored_tokens"] == scored,
                    "sieve eval scored %d tokens" % records[0]["scored_tokens"])
            answers = {}
            for max_tokens in (0, 1):
                body = post(port, "/v1/completions", loglikelihood_payload([ids], max_tokens))
                answers[max_tokens] = body["choices"][0]
                logprobs = answers[max_tokens]["logprobs"]
                f.check(len(logprobs["tokens"]) == len(ids) + max_tokens and
                        logprobs["token_logprobs"][0] is None and
                        logprobs["top_logprobs"][0] is None and
                        body["usage"]["completion_tokens"] == max_tokens and
                        answers[max_tokens]["finish_reason"] == "length",
                        "max_tokens %d: %d entries, the first null, %d generated" % (
                            max_tokens, len(logprobs["tokens"]), max_tokens))
            ctxlen = CONTEXT  # the eval's prompt: its scored tokens start at index CONTEXT
            server_nll = -harness_parse(answers[0], ctxlen, 0)[0]
            f.check(abs(server_nll - eval_nll) <= NLL_RELATIVE_TOLERANCE * abs(eval_nll),
                    "total NLL of %d tokens: server %.6f, sieve eval %.6f (|diff| %.2e, bound "
                    "%.1e of it)" % (scored, server_nll, eval_nll, abs(server_nll - eval_nll),
                                     NLL_RELATIVE_TOLERANCE))
            # 2. max_tokens 1 (the harness today) reads the same numbers, and its last entry is
            # the greedy token.
            zero, one = harness_parse(answers[0], ctxlen, 0), harness_parse(answers[1], ctxlen, 1)
            f.check(abs(zero[0] - one[0]) <= NLL_RELATIVE_TOLERANCE * abs(zero[0]) and
                    zero[1] == one[1],
                    "max_tokens 0 and 1: the same (sum, is_greedy) as lm-eval parses them: "
                    "%r, %r" % (zero, one))
            last = answers[1]["logprobs"]
            f.check(abs(last["token_logprobs"][-1] - max(last["top_logprobs"][-1].values())) <
                    1e-6, "the generated token at temperature 0 is its top logprob")
            # Greedy flags: position p is greedy iff its token is what greedy generation from
            # the prefix before it picks, with the same logprob.
            echo = answers[0]["logprobs"]
            positions = rng.sample(range(1, len(ids)), 6)
            agree = []
            for position in positions:
                gen = post(port, "/v1/completions",
                           {"prompt": ids[:position], "max_tokens": 1, "temperature": 0,
                            "logprobs": 1})["choices"][0]["logprobs"]
                top = echo["top_logprobs"][position]
                greedy = echo["token_logprobs"][position] == max(top.values())
                agree.append(greedy == (gen["tokens"][0] == echo["tokens"][position]) and
                             abs(max(top.values()) - gen["token_logprobs"][0]) < LOGPROB_TOLERANCE)
            f.check(all(agree), "greedy flags at positions %s agree with greedy generation: %s"
                    % (positions, agree))

            # 3. A batch of (context, continuation) pairs as the harness sends them.
            pairs = []
            for _ in range(4):
                cut = rng.randrange(8, 40)
                length = rng.randrange(cut + 1, cut + 30)
                offset = rng.randrange(0, len(tokens) - length)
                pairs.append((bos + tokens[offset:offset + cut],
                              tokens[offset + cut:offset + length]))
            for max_tokens in (0, 1):
                body = post(port, "/v1/completions", loglikelihood_payload(
                    [c + x for c, x in pairs], max_tokens))
                choices = sorted(body["choices"], key=lambda c: c["index"])
                results = [harness_parse(choice, len(c), max_tokens)
                           for choice, (c, _) in zip(choices, pairs)]
                alone = [harness_parse(post(port, "/v1/completions", loglikelihood_payload(
                    [c + x], max_tokens))["choices"][0], len(c), max_tokens) for c, x in pairs]
                f.check(len(choices) == len(pairs) and all(
                    abs(a[0] - b[0]) < LOGPROB_TOLERANCE and a[1] == b[1]
                    for a, b in zip(results, alone)),
                        "max_tokens %d: a batch of %d id prompts answers as each alone: %s" % (
                            max_tokens, len(pairs), [(round(s, 3), g) for s, g in results]))
            # A text prompt with echo: the text comes back first.
            body = post(port, "/v1/completions", {"prompt": text[:80], "echo": True,
                                                  "max_tokens": 3, "temperature": 0})
            f.check(body["choices"][0]["text"].startswith(text[:80]),
                    "echo of a text prompt opens with the prompt")
            status, _, raw = http_request(port, "POST", "/v1/completions", dict(
                loglikelihood_payload([ids[:20]], 2), stream=True), raw=True)
            events = [json.loads(line[6:]) for line in dechunk(raw).split("\n")
                      if line.startswith("data: {")]
            first = events[0]["choices"][0]["logprobs"] if events else {}
            f.check(status == 200 and len(first.get("tokens", [])) >= 20 and
                    first["token_logprobs"][0] is None,
                    "streamed echo: the first event carries the prompt's %d entries" % (
                        len(first.get("tokens", []))))

            # 5. Bad input: 400 with an OpenAI error body naming the field.
            vocab = info.get("vocab_size", 1 << 20)
            bad = [
                ({"prompt": ids[:5], "echo": True, "logprobs": 21}, "logprobs"),
                ({"prompt": [1, vocab + 5], "echo": True, "logprobs": 1}, "prompt"),
                ({"prompt": [-1], "max_tokens": 1}, "prompt"),
                ({"prompt": "", "echo": True, "max_tokens": 0}, "prompt"),
                ({"prompt": [], "echo": True, "max_tokens": 0}, "prompt"),
                ({"prompt": [[1, 2], []], "echo": True, "max_tokens": 0}, "prompt"),
                ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
                ({"prompt": "hi", "echo": 1}, "echo"),
            ]
            for body, param in bad:
                status, _, text_body = http_request(port, "POST", "/v1/completions", body)
                error = json.loads(text_body).get("error", {}) if status == 400 else {}
                f.check(status == 400 and error.get("param") == param and error.get("message"),
                        "400 for %s: %s" % (json.dumps(body)[:60], error.get("message")))
            status, _, text_body = http_request(port, "POST", "/detokenize",
                                                {"tokens": [vocab + 1]})
            f.check(status == 400 and json.loads(text_body)["error"]["param"] == "tokens",
                    "/detokenize of an id outside the vocabulary: 400")
            status = http_request(port, "GET", "/health")[0]
            again = post(port, "/v1/completions", loglikelihood_payload([ids[:30]], 0))
            f.check(status == 200 and server.poll() is None and all(
                abs(a - b) < LOGPROB_TOLERANCE for a, b in zip(
                    again["choices"][0]["logprobs"]["token_logprobs"][1:],
                    answers[0]["logprobs"]["token_logprobs"][1:30])),
                    "still serving after the bad requests, with the same numbers")
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    print("%d passed, %d failed" % (f.passed, len(f.items)))
    return 1 if f.items else 0


if __name__ == "__main__":
    sys.exit(main())
