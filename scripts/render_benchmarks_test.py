#!/usr/bin/env python3
"""Tests the results page's path from a GPU run's files to docs/benchmarks.md: what
scripts/gpu_check.sh headline writes (sweep_WORKLOAD_{dense,sparse}.json, summary.txt) bundled by
scripts/record_gpu_results.py, then rendered by scripts/render_benchmarks.py, for the one-GPU
Llama-3-8B headline and a tensor-parallel Llama-3-70B one whose two sides came back from two runs;
and the FP8 section (issue 58) from scripts/gpu_check.sh fp8_headline's, serve_fp8's and kv_fp8's
files, its rows beside their bounds and its targets met or missed.
Every number is drawn at random (the seed is printed; SIEVE_TEST_SEED replays it).

    python3 scripts/render_benchmarks_test.py     # CTest: render_benchmarks_test
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
import render_benchmarks  # noqa: E402

SEED = int(os.environ.get("SIEVE_TEST_SEED", "").split(",")[0] or random.randrange(1 << 30))
print(f"render_benchmarks_test: seed {SEED} (SIEVE_TEST_SEED={SEED} replays it)")
RNG = random.Random(SEED)


def level(concurrency, tp):
    """One level of a `sieve bench sweep` result with its bound, numbers drawn at random."""
    prefill_s, decode_s = RNG.uniform(5, 30), RNG.uniform(2, 15)
    return {"concurrency": concurrency,
            "metrics": {"output_throughput": RNG.uniform(100, 5000),
                        "median_ttft_ms": RNG.uniform(50, 2000),
                        "median_tpot_ms": RNG.uniform(3, 60)},
            "bound": {"fraction": RNG.uniform(0.6, 0.99),
                      "roofline_fraction": RNG.uniform(0.6, 0.99),
                      "output_throughput": RNG.uniform(200, 6000),
                      "prefill_s": prefill_s, "decode_s": decode_s,
                      "all_reduce_s": RNG.uniform(0.05, 0.3) * (prefill_s + decode_s) if tp > 1
                      else 0.0,
                      "allreduce_bus_gbs": 370.0, "allreduce_latency_us": 8.0,
                      "gemm_tflops": 700.0, "copy_gbs": 4200.0,
                      "pool_limited_steps": RNG.choice([0, 0, 12]), "compute_bound_steps": 0,
                      "tensor_parallel_size": tp}}


def sweep(levels, tp):
    return {"kind": "sieve_bench_sweep", "levels": [level(c, tp) for c in levels]}


def write_run(directory, sweeps, gpu):
    """A scripts/gpu_check.sh headline run's files: its sweeps and its summary."""
    os.makedirs(directory)
    for name, result in sweeps.items():
        with open(os.path.join(directory, f"sweep_{name}.json"), "w") as f:
            json.dump(result, f)
    with open(os.path.join(directory, "summary.txt"), "w") as f:
        f.write(f"gpu: {gpu}, 580.159.04, 345 MHz, 3201 MHz\n")


def record(files_dir, name, results_dir):
    subprocess.run([sys.executable, os.path.join(SCRIPTS, "record_gpu_results.py"), files_dir,
                    name, "--commit", "abc1234", "--command", f"run {name}",
                    "--results-dir", results_dir], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(results_dir, name + ".json")) as f:
        return json.load(f)


class RenderHeadlineTest(unittest.TestCase):
    def setUp(self):
        self.temp = tempfile.TemporaryDirectory()
        self.results = os.path.join(self.temp.name, "results")
        os.makedirs(self.results)
        with open(os.path.join(self.results, "headline_methods.md"), "w") as f:
            f.write("## How each number is measured\n")
        self.saved_results = render_benchmarks.RESULTS
        render_benchmarks.RESULTS = self.results

    def tearDown(self):
        render_benchmarks.RESULTS = self.saved_results
        self.temp.cleanup()

    def run_and_record(self, name, sweeps, gpu="NVIDIA H200"):
        files = os.path.join(self.temp.name, "files_" + name)
        write_run(files, sweeps, gpu)
        return record(files, name, self.results)

    def write_headline(self, names):
        with open(os.path.join(self.results, "headline.txt"), "w") as f:
            f.write("# KIND RECORD COMMAND\n")
            for name in names:
                f.write(f"headline {name} run {name}\n")

    def test_tensor_parallel_sides_from_two_runs_render_as_one_section(self):
        one_gpu = self.run_and_record("one-gpu", {
            "4k_dense": sweep([1, 20, 128, 256], 1), "4k_sparse": sweep([1, 20, 128, 256], 1)})
        tp = RNG.choice([2, 4, 8])
        dense = self.run_and_record("tp-dense", {f"70b-4k-tp{tp}_dense": sweep([1, 20], tp)})
        sparse = self.run_and_record("tp-sparse", {f"70b-4k-tp{tp}_sparse": sweep([1, 20], tp)})
        # record_gpu_results keeps every sweep, hyphenated workload names too.
        self.assertEqual(set(dense["sweeps"]), {f"70b-4k-tp{tp}_dense"})
        self.assertEqual(set(sparse["sweeps"]), {f"70b-4k-tp{tp}_sparse"})
        self.assertEqual(set(one_gpu["sweeps"]), {"4k_dense", "4k_sparse"})
        self.write_headline(["one-gpu", "tp-dense", "tp-sparse"])
        page, charts = render_benchmarks.render()

        tp_title = f"## The headline of the Llama-3-70B shape over {tp} x NVIDIA H200"
        self.assertIn("## The headline on NVIDIA H200: serving throughput", page)
        self.assertIn(tp_title, page)
        one_gpu_part, tp_part = page.split(tp_title)
        # The targets are the one-GPU headline's; the tensor-parallel one has none.
        self.assertIn("Targets:", one_gpu_part)
        self.assertNotIn("Targets:", tp_part)
        # Both runs' provenance in the tensor-parallel section, neither in the other.
        for name in ("tp-dense", "tp-sparse"):
            self.assertIn(f"Record `bench/results/{name}.json`", tp_part)
            self.assertNotIn(f"Record `bench/results/{name}.json`", one_gpu_part)
        self.assertIn("Record `bench/results/one-gpu.json`", one_gpu_part)
        # Each tensor-parallel row: dense and sparse side by side, and the all-reduces' share of
        # each side's bound.
        for d, p in zip(dense["sweeps"][f"70b-4k-tp{tp}_dense"]["levels"],
                        sparse["sweeps"][f"70b-4k-tp{tp}_sparse"]["levels"]):
            share = [x["bound"]["all_reduce_s"] / (x["bound"]["prefill_s"] + x["bound"]["decode_s"])
                     for x in (d, p)]
            row = next(line for line in tp_part.splitlines()
                       if line.startswith(f"| {d['concurrency']} |"))
            self.assertIn(render_benchmarks.fmt(d["metrics"]["output_throughput"]), row)
            self.assertIn(render_benchmarks.fmt(p["metrics"]["output_throughput"]), row)
            self.assertTrue(row.endswith(f"| {share[0]:.0%} / {share[1]:.0%} |"), row)
        self.assertEqual(set(charts), {"headline_h200_4k.svg", f"headline_h200_70b-tp{tp}_4k.svg"})

    def test_a_sweep_of_no_known_workload_is_refused(self):
        self.run_and_record("odd", {"4k-tpx_dense": sweep([1], 1)})
        self.write_headline(["odd"])
        with self.assertRaises(SystemExit) as raised:
            render_benchmarks.render()
        self.assertIn("4k-tpx_dense", str(raised.exception))

    def test_workload_names_round_trip(self):
        for shape, length, tp in (("8b", "4k", 1), ("8b", "16k", 1), ("70b", "4k", 2),
                                  ("70b", "16k", RNG.choice([4, 8])), ("8b", "4k", 2)):
            name = render_benchmarks.workload_name(shape, length, tp)
            self.assertEqual(render_benchmarks.parse_workload(name), (shape, length, tp), name)
        self.assertEqual(render_benchmarks.workload_name("8b", "4k", 1), "4k")
        for bad in ("70b", "4k-tp", "tp2", "70b-4k-tp2-x", ""):
            self.assertIsNone(render_benchmarks.parse_workload(bad), bad)


def fp8_level(concurrency, prompts, tok, fraction, pool_limited=False):
    """One level of an fp8_headline sweep: `tok` output tok/s at `fraction` of its bound."""
    level = {"concurrency": concurrency, "num_prompts": prompts,
             "metrics": {"output_throughput": tok, "median_ttft_ms": RNG.uniform(100, 90000),
                         "median_tpot_ms": RNG.uniform(10, 200)},
             "bound": {"fraction": fraction, "roofline_fraction": fraction,
                       "output_throughput": tok / fraction, "prefill_s": 150.0, "decode_s": 30.0,
                       "gemm_tflops": 690.0, "fp8_gemm_tflops": 840.0, "attention_tflops": 560.0,
                       "copy_gbs": 3000.0, "pool_limited_steps": 7 if pool_limited else 0,
                       "compute_bound_steps": 0},
             "requests": [{"ttft_ms": 1.0, "itl_ms": [1.0, 2.0]}]}
    return level


class RenderFp8Test(unittest.TestCase):
    """The FP8 section: fp8_headline's sweeps bundled by record_gpu_results.py, rendered beside
    their bounds with issue 58's targets on the card the run used."""

    def setUp(self):
        self.temp = tempfile.TemporaryDirectory()
        self.results = os.path.join(self.temp.name, "results")
        os.makedirs(self.results)
        with open(os.path.join(self.results, "headline_methods.md"), "w") as f:
            f.write("## How each number is measured\n")
        self.saved_results = render_benchmarks.RESULTS
        render_benchmarks.RESULTS = self.results

    def tearDown(self):
        render_benchmarks.RESULTS = self.saved_results
        self.temp.cleanup()

    def record_files(self, name, files, gpu):
        directory = os.path.join(self.temp.name, "files_" + name)
        os.makedirs(directory)
        for file, content in files.items():
            with open(os.path.join(directory, file), "w") as f:
                json.dump(content, f)
        with open(os.path.join(directory, "summary.txt"), "w") as f:
            f.write(f"gpu: {gpu}, 580.159.04, 345 MHz, 2619 MHz\n")
        return record(directory, name, self.results)

    def render(self, entries):
        with open(os.path.join(self.results, "headline.txt"), "w") as f:
            f.write("# KIND RECORD COMMAND\n")
            for kind, name in entries:
                f.write(f"{kind} {name} run {name}\n")
        return render_benchmarks.render()

    def fp8_part(self, page):
        start = page.index("## FP8 weights and KV cache")
        end = page.find("\n## ", start + 1)
        return page[start:end if end >= 0 else len(page)]

    def test_5k_runs_render_beside_their_bounds_with_the_targets_of_their_card(self):
        for gpu, tag, anchor in (("NVIDIA H100 80GB HBM3", "h100", 3459),
                                 ("NVIDIA H200", "h200", 3902)):
            with self.subTest(gpu=gpu):
                # FP8 dense on one side of TensorRT-LLM's number, FP8 + FP8 KV sparse on either
                # side of 1.5x it; every FP8 row at or above 85% of its bound, or one not.
                dense_tok = anchor * RNG.choice([0.8, 1.1])
                sparse_tok = 1.5 * anchor * RNG.choice([0.9, 1.05])
                fractions = {"fp8-dense": RNG.uniform(0.86, 0.99),
                             "fp8-sparse": RNG.choice([RNG.uniform(0.6, 0.84),
                                                       RNG.uniform(0.86, 0.99)]),
                             "fp8-fp8kv-sparse": RNG.uniform(0.86, 0.99)}
                toks = {"fp8-dense": dense_tok, "fp8-sparse": RNG.uniform(3000, 4000),
                        "fp8-fp8kv-sparse": sparse_tok}
                files = {f"fp8_headline_5k_{run}.json": {
                    "kind": "sieve_bench_sweep",
                    "levels": [fp8_level(1500, 1500, toks[run], fractions[run],
                                         pool_limited=run == "fp8-dense")]}
                    for run in toks}
                # bf16 is no FP8 row: its fraction does not count.
                files["fp8_headline_5k_bf16-dense.json"] = {
                    "kind": "sieve_bench_sweep", "levels": [fp8_level(1500, 1000, 2000, 0.5)]}
                name = f"fp8-{tag}"
                recorded = self.record_files(name, files, gpu)
                self.assertEqual(set(recorded["fp8_headline"]),
                                 {"5k_bf16-dense", "5k_fp8-dense", "5k_fp8-sparse",
                                  "5k_fp8-fp8kv-sparse"})
                # record_gpu_results drops the per-token gaps.
                for sweep in recorded["fp8_headline"].values():
                    self.assertNotIn("itl_ms", sweep["levels"][0]["requests"][0])
                page, charts = self.render([("fp8", name)])
                part = self.fp8_part(page)
                self.assertIn(f"Record `bench/results/{name}.json`", part)
                lines = part.splitlines()
                # Each row beside its bound, in the configurations' order.
                order = []
                for run, tok in list(toks.items()) + [("bf16-dense", 2000)]:
                    row = next(line for line in lines if line.startswith(f"| {run} ("))
                    order.append(lines.index(row))
                    bound = tok / (fractions.get(run, 0.5))
                    self.assertIn(f"| {render_benchmarks.fmt(tok)} | "
                                  f"{render_benchmarks.fmt(bound)} | "
                                  f"{fractions.get(run, 0.5):.0%}", row)
                self.assertIn("†", next(line for line in lines if line.startswith("| fp8-dense (")))
                self.assertEqual(sorted(order), [order[3], order[0], order[1], order[2]])
                targets = [line for line in lines if line.startswith(f"- {gpu}: ")]
                dense = next(line for line in targets if "fp8-dense at 5000/500" in line)
                self.assertIn(f"target >= {render_benchmarks.fmt(anchor)}", dense)
                self.assertIn("met" if dense_tok >= anchor else "missed", dense)
                self.assertNotIn("missed" if dense_tok >= anchor else "met", dense)
                sparse = next(line for line in targets if "fp8-fp8kv-sparse at 5000/500" in line)
                self.assertIn(f"target >= {render_benchmarks.fmt(math.ceil(1.5 * anchor))}", sparse)
                self.assertIn(f"is {1.5 * anchor / (sparse_tok / fractions['fp8-fp8kv-sparse']):.0%}"
                              " of this row's bound", sparse)
                self.assertIn(": met" if sparse_tok >= 1.5 * anchor else ": missed", sparse)
                worst = min(fractions.values())
                every = next(line for line in targets if "every FP8 row" in line)
                self.assertIn(f"lowest {worst:.0%}", every)
                self.assertTrue(every.endswith("met)" if worst >= 0.85 else "missed)"), every)
                self.assertIn(f"fp8_{tag}_5k.svg", charts)

    def test_serve_and_decode_step_records_render_with_the_decode_step_target(self):
        def serve(tok):
            return {"config": {"dataset": {"input_len": 4000, "output_len": 500}},
                    "metrics": {"output_throughput": tok, "completed": 256,
                                "median_ttft_ms": 700.0, "median_tpot_ms": 40.0}}

        def kernels(kv, sparse_ratio):
            step = {"batch": 64, "context": 4096, "bytes": 9.8e9, "bound_ms": 3.27,
                    "step_ms": 3.27 * sparse_ratio, "ratio": sparse_ratio,
                    "tokens_per_second": 11000.0, "kept_fraction": 0.1}
            return {"quantization": "fp8", "kv_cache_dtype": kv,
                    "decode_step_dense": dict(step, kept_fraction=1.0, ratio=1.1),
                    "decode_step_sparse": step}

        ratio = RNG.choice([1.1, 1.7])
        tok = RNG.uniform(2000, 4000)
        self.record_files("kv", {"serve_fp8_fp8_fp8kv_dense_c128.json": serve(tok),
                                 "serve_fp8_fp8_sparse_c64.json": serve(tok / 2),
                                 "kernels_fp8_kv_auto.json": kernels("auto", 1.6),
                                 "kernels_fp8_kv_fp8.json": kernels("fp8", ratio)},
                          "NVIDIA H100 80GB HBM3")
        page, _ = self.render([("fp8", "kv")])
        part = self.fp8_part(page)
        row = next(line for line in part.splitlines() if line.startswith("| fp8-fp8kv-dense ("))
        self.assertIn(f"| 128 | 256 | {render_benchmarks.fmt(tok)} |", row)
        self.assertIn("| fp8-sparse (", part)
        target = next(line for line in part.splitlines() if "decode step with FP8 weights" in line)
        self.assertIn(f"{ratio:.2f}x its byte bound", target)
        self.assertTrue(target.endswith("met)" if ratio <= 1.2 else "missed)"), target)
        # No fp8_headline record: the 5000/500 targets say so.
        self.assertIn("no record yet", part)


if __name__ == "__main__":
    unittest.main()
