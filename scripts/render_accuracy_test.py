#!/usr/bin/env python3
"""Tests scripts/render_accuracy.py on records written here: an older record without the weight
and KV cache precision renders as before, records of one grid at three precisions get their
precision in the header and one comparison table (in the unquantized record's section) whose
differences, missed targets and changed answers follow from their numbers, and a record of another
grid stays out of that table; records of one two-turn run with turn 2 run three ways get one table
in the prefill-with-cache record's section; a gzipped record renders as its plain form, and a
record both plain and gzipped is refused.

    python3 scripts/render_accuracy_test.py     # CTest: render_accuracy_test
"""
import gzip
import json
import os
import sys
import tempfile
import unittest

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
import render_accuracy  # noqa: E402

CONFIGS = ["full", "snapkv@256"]


def record(scores, perplexity, **settings):
    """A `sieve eval --result-json` record: passkey scores and a perplexity per configuration."""
    base = {"model": "tiny", "device": "cpu (2 threads)", "tasks": ["passkey", "perplexity"],
            "lengths": [1000], "depths": [0.5], "samples": 2, "seed": 0,
            "policies": ["snapkv"], "budgets": [256], "window": 32}
    base.update(settings)
    configs = [{"label": label, "policy": label.split("@")[0],
                "budget": int(label.split("@")[1]) if "@" in label else None,
                "kv": {"kept_fraction": 1.0, "seconds": 1.0}} for label in CONFIGS]
    cells, summary = [], []
    for label, score, ppl in zip(CONFIGS, scores, perplexity):
        cells.append({"task": "passkey", "length": 1000, "depth": 0.5, "config": label,
                      "samples": 2, "score": score})
        cells.append({"task": "perplexity", "length": 1000, "depth": None, "config": label,
                      "samples": 2, "perplexity": ppl})
        summary.append({"task": "passkey", "config": label, "samples": 2, "score": score})
        summary.append({"task": "perplexity", "config": label, "samples": 2, "perplexity": ppl})
    # Two passkey answers per configuration: the first right when the score is 1 or 0.5.
    samples = [{"task": "passkey", "config": label, "length": 1000, "depth": 0.5, "index": index,
                "output": " 123" if (index == 0 and score >= 0.5) or score == 1.0 else " 9"}
               for label, score in zip(CONFIGS, scores) for index in range(2)]
    samples += [{"task": "perplexity", "config": label, "length": 1000, "depth": None,
                 "index": 0, "nll": 1.0} for label in CONFIGS]
    return {"settings": base, "configs": configs, "cells": cells, "summary": summary,
            "records": samples}


def precision(quantization, kv_cache_dtype):
    return {"quantization": quantization, "activation_dtype": "f32",
            "kv_cache_dtype": kv_cache_dtype,
            "command": f"sieve eval --quantization {quantization}"}


class RenderAccuracyTest(unittest.TestCase):
    def render(self, records, gzipped=(), sidecars=None):
        """{stem: section text} of the page of `records`, those named in `gzipped` as .json.gz,
        with `sidecars` ({stem: text}) as NAME.md beside them."""
        with tempfile.TemporaryDirectory() as results:
            for name, text in (sidecars or {}).items():
                with open(os.path.join(results, name + ".md"), "w") as f:
                    f.write(text)
            for name, data in records.items():
                path = os.path.join(results, name + ".json")
                if name in gzipped:
                    with gzip.open(path + ".gz", "wt", encoding="utf-8") as f:
                        json.dump(data, f)
                else:
                    with open(path, "w") as f:
                        json.dump(data, f)
            page = render_accuracy.render(results, os.path.join(results, "plots"),
                                          os.path.join(results, "accuracy.md"))
        # {stem: its section's text}
        sections = {}
        for part in page.split("\n## ")[1:]:
            stem, _, body = part.partition("\n")
            sections[stem] = body
        return sections

    def test_older_record_without_precision(self):
        sections = self.render({"old": record([1.0, 0.5], [10.0, 11.0])})
        self.assertNotIn("**Weights:**", sections["old"])
        self.assertNotIn("Against other weight", sections["old"])
        self.assertIn("| passkey | 2 | 100.0 | 50.0 |", sections["old"])

    def test_precisions_compared(self):
        sections = self.render({
            "a-f32": record([1.0, 0.5], [10.0, 11.0], **precision("none", "f32")),
            "b-fp8": record([1.0, 0.5], [10.1, 11.0], **precision("fp8", "f32")),
            "c-fp8-kv": record([0.5, 0.5], [10.0, 11.5], **precision("fp8", "f8_e4m3")),
            "d-other-grid": record([1.0, 1.0], [9.0, 9.0], seed=1,
                                   **precision("fp8", "f8_e4m3")),
        })
        self.assertIn("- **Weights:** unquantized (f32) (`--quantization none`); "
                      "**activations:** f32; **KV cache:** f32", sections["a-f32"])
        self.assertIn("**KV cache:** FP8 e4m3, a scale per layer and KV head",
                      sections["c-fp8-kv"])
        self.assertIn("(`--quantization fp8`)", sections["b-fp8"])
        # One table, in the baseline's section, without the record of another grid.
        table = [line for line in sections["a-f32"].splitlines() if line.startswith("| ")]
        self.assertIn("| task | configuration | f32 | fp8 weights | fp8 weights + fp8 KV | "
                      "Δ fp8 weights | Δ fp8 weights + fp8 KV | answers changed, fp8 weights | "
                      "answers changed, fp8 weights + fp8 KV |", table)
        self.assertIn("| passkey | `full` | 100.0 | 100.0 | 50.0 | +0.0 | **-50.0** | 0/2 | 1/2 |",
                      table)
        self.assertIn("|  | `snapkv@256` | 50.0 | 50.0 | 50.0 | +0.0 | +0.0 | 0/2 | 0/2 |", table)
        self.assertIn("| perplexity (lower is better) | `full` | 10.00 | 10.10 | 10.00 | +1.0% "
                      "| +0.0% | – | – |", table)
        self.assertIn("|  | `snapkv@256` | 11.00 | 11.00 | 11.50 | +0.0% | **+4.5%** | – | – |",
                      table)
        self.assertIn("[a-f32](#a-f32)", sections["a-f32"])
        self.assertNotIn("d-other-grid", sections["a-f32"])
        for stem in ("b-fp8", "c-fp8-kv", "d-other-grid"):
            self.assertNotIn("Against other weight", sections[stem])

    def test_gzipped_record_renders_as_plain(self):
        records = {
            "a-f32": record([1.0, 0.5], [10.0, 11.0], **precision("none", "f32")),
            "b-fp8": record([0.5, 0.5], [10.2, 11.0], **precision("fp8", "f32")),
        }
        sidecars = {"a-f32": "Run on the test machine.\n"}
        plain = self.render(records, sidecars=sidecars)
        self.assertIn("Against other weight", plain["a-f32"])
        self.assertIn("Run on the test machine.", plain["a-f32"])
        for gzipped in (("a-f32",), ("b-fp8",), ("a-f32", "b-fp8")):
            self.assertEqual(self.render(records, gzipped, sidecars), plain, gzipped)

    def test_record_both_plain_and_gzipped_is_refused(self):
        with tempfile.TemporaryDirectory() as results:
            data = record([1.0, 0.5], [10.0, 11.0])
            with open(os.path.join(results, "twice.json"), "w") as f:
                json.dump(data, f)
            with gzip.open(os.path.join(results, "twice.json.gz"), "wt", encoding="utf-8") as f:
                json.dump(data, f)
            with self.assertRaises(SystemExit) as raised:
                render_accuracy.render(results, os.path.join(results, "plots"),
                                       os.path.join(results, "accuracy.md"))
            self.assertIn("twice", str(raised.exception))

    def test_no_baseline_no_table(self):
        sections = self.render({
            "b-fp8": record([1.0, 0.5], [10.0, 11.0], **precision("fp8", "f32")),
            "c-fp8-kv": record([1.0, 0.5], [10.0, 11.0], **precision("fp8", "f8_e4m3")),
        })
        self.assertFalse(any("Against other weight" in body for body in sections.values()))

    def test_two_turn_ways_compared(self):
        def conversation(second_turn, scores, looked_up, seconds):
            """A niah-two-turn record: turn 2's scores, turn 1's right on the first sample."""
            data = record(scores, [10.0, 10.0], tasks=["niah-two-turn"], second_turn=second_turn,
                          command=f"sieve eval --second-turn {second_turn}")
            for item in data["cells"] + data["summary"]:
                item["task"] = "niah-two-turn"
            data["cells"] = [c for c in data["cells"] if "score" in c]
            data["summary"] = [c for c in data["summary"] if "score" in c]
            data["records"] = [
                dict(r, task="niah-two-turn", first_turn_score=float(r["index"] == 0))
                for r in data["records"] if r["task"] == "passkey"]
            for config in data["configs"]:
                config["kv"]["turns"] = [
                    {"seconds": 5.0, "prefix_cache_queries": looked_up},
                    {"seconds": seconds, "prefix_cache_queries": looked_up}]
            return data
        sections = self.render({
            "on": conversation("prefill", [1.0, 0.5], 100, 1.5),
            "off": conversation("prefill", [1.0, 0.5], 0, 9.0),
            "reuse": conversation("reuse", [1.0, 0.0], 100, 2.0),
        })
        table = [line for line in sections["on"].splitlines() if line.startswith("| ")]
        self.assertIn("| configuration | turn 1 | turn 2, prefill, cache on | turn 2, prefill, "
                      "cache off | turn 2, reuse | turn 2 time, prefill, cache on | turn 2 time, "
                      "prefill, cache off | turn 2 time, reuse |", table)
        self.assertIn("| `full` | 50.0 | 100.0 | 100.0 | 100.0 | 1.5 s | 9.0 s | 2.0 s |", table)
        self.assertIn("| `snapkv@256` | 50.0 | 50.0 | 50.0 | 0.0 | 1.5 s | 9.0 s | 2.0 s |",
                      table)
        for stem in ("off", "reuse"):
            self.assertNotIn("Turn 2: prefilled", sections[stem])


if __name__ == "__main__":
    unittest.main()
