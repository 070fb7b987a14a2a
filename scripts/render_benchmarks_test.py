#!/usr/bin/env python3
"""Tests the results page's path from a GPU run's files to docs/benchmarks.md: what
scripts/gpu_check.sh headline writes (sweep_WORKLOAD_{dense,sparse}.json, summary.txt) bundled by
scripts/record_gpu_results.py, then rendered by scripts/render_benchmarks.py, for the one-GPU
Llama-3-8B headline and a tensor-parallel Llama-3-70B one whose two sides came back from two runs.
Every number is drawn at random (the seed is printed; SIEVE_TEST_SEED replays it).

    python3 scripts/render_benchmarks_test.py     # CTest: render_benchmarks_test
"""
import json
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


if __name__ == "__main__":
    unittest.main()
