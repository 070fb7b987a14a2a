#!/usr/bin/env python3
"""Renders docs/benchmark_results.md from bench/results/*.json (written by
scripts/record_gpu_results.py and the CPU benchmark script). Numbers come only from those files."""
import glob
import json
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..")


def fmt(value, digits=0):
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else str(value)


def render(record):
    out = [f"## {record['name']}", ""]
    out.append(f"- GPU: {record.get('gpu', '?')}; commit `{record['commit']}`; recorded "
               f"{record['recorded']}")
    out.append(f"- Command: `{record['command']}`")
    out.append("")
    kernels = record.get("kernels")
    sdpa = {}
    if record.get("sdpa"):
        for row in record["sdpa"]["results"]:
            if "tflops" in row:
                sdpa[(row["backend"], row["n"])] = row["tflops"]
    if kernels:
        out += ["### Ceilings measured in the same run", "",
                "| what | measured | PERF.md |", "| --- | --- | --- |",
                f"| device-to-device copy | {fmt(kernels['copy_bandwidth_gbs'])} GB/s | ~4,194 GB/s |",
                f"| bf16 GEMM 8192^3 (cuBLASLt) | {fmt(kernels['gemm_tflops'])} TFLOP/s | ~790 TFLOP/s |",
                ""]
        if kernels.get("attention"):  # a run with --skip-attention has none
            out += ["### Attention kernels", "",
                    "| kernel | time | achieved | target | vs target | PyTorch SDPA same shape |",
                    "| --- | --- | --- | --- | --- | --- |"]
        for row in kernels.get("attention", []):
            reference = ""
            match = re.match(r"prefill causal n=(\d+)", row["name"])
            if match:
                n = int(match.group(1))
                parts = []
                for backend in ("flash", "cudnn"):
                    if (backend, n) in sdpa:
                        parts.append(f"{backend} {fmt(sdpa[(backend, n)])} "
                                     f"(ours {row['value'] / sdpa[(backend, n)]:.0%})")
                reference = "; ".join(parts)
            target = f"{fmt(row['target'])} {row['unit']}" if row["target"] else "—"
            versus = f"{row['value'] / row['target']:.0%}" if row["target"] else \
                f"{row['value'] / row['bound']:.0%} of bound"
            out.append(f"| {row['name']} | {row['median_ms']:.3f} ms | {fmt(row['value'])} "
                       f"{row['unit']} | {target} | {versus} | {reference} |")
        if kernels.get("attention"):
            out.append("")
        for key, label in (("decode_step_dense", "dense"), ("decode_step_sparse", "1/10 kept")):
            step = kernels.get(key)
            if not step:
                continue
            if label == "dense":
                out += ["### Whole decode step (Llama-3-8B shape, dummy weights, CUDA graph)", "",
                        "| KV | batch x context | step | bound (bytes / copy rate) | ratio | tok/s |"
                        " target |", "| --- | --- | --- | --- | --- | --- | --- |"]
            # Runs from session 4 on also time one replay's launch + run + synchronise on the host.
            host = (f" (host {step['step_wall_ms']:.2f})" if 'step_wall_ms' in step else "")
            out.append(f"| {label} | {step['batch']} x {step['context']} | {step['step_ms']:.2f} ms"
                       f"{host} | {step['bound_ms']:.2f} ms | {step['ratio']:.2f}x | "
                       f"{fmt(step['tokens_per_second'])} | <= 1.3x: "
                       f"{'met' if step['ratio'] <= 1.3 else 'missed'} |")
        out.append("")
        variants = [(key, step) for key, step in kernels.items()
                    if key.startswith("decode_step_") and key not in
                    ("decode_step_dense", "decode_step_sparse")]
        if variants:
            out += ["Variants in the same run (each on a backend of its own):", "",
                    "| variant | step | ratio to the bound |", "| --- | --- | --- |"]
            for key, step in variants:
                name = key.replace("decode_step_", "").replace("sparse", "1/10 kept")
                host = (f" (host {step['step_wall_ms']:.2f})" if 'step_wall_ms' in step else "")
                out.append(f"| {name.replace('_', ' ')} | {step['step_ms']:.2f} ms{host} | "
                           f"{step['ratio']:.2f}x |")
            out.append("")
        dense_parts = (kernels.get("decode_step_dense") or {}).get("parts")
        sparse_parts = (kernels.get("decode_step_sparse") or {}).get("parts")
        if dense_parts and sparse_parts:
            copy = kernels["copy_bandwidth_gbs"] * 1e9
            out += ["Where a step's time goes: each kind of op, for all layers, captured alone in a "
                    "graph (the parts need not add up to the step: neighbours change them).", "",
                    "| op | dense | 1/10 kept | bytes / copy rate (1/10 kept) | 1/10 kept vs that |",
                    "| --- | --- | --- | --- | --- |"]
            for dense_part, part in zip(dense_parts, sparse_parts):
                bound_ms = part["bytes"] / copy * 1e3
                out.append(f"| {part['name']} | {dense_part['ms']:.3f} ms | {part['ms']:.3f} ms | "
                           f"{bound_ms:.3f} ms | {part['ms'] / bound_ms:.2f}x |")
            out.append(f"| sum of the parts | {sum(p['ms'] for p in dense_parts):.3f} ms | "
                       f"{sum(p['ms'] for p in sparse_parts):.3f} ms | | |")
            out.append("")
        gemm = kernels.get("gemm")
        if gemm:
            copy = kernels["copy_bandwidth_gbs"]
            out += ["### GEMMs at decode batch sizes", "",
                    "Weights streamed cold (rotating copies larger than the L2), calls back to back "
                    "in a CUDA graph; GB/s of weights and the fraction of the copy rate.", "",
                    "| m | GEMM | n x k | cuBLASLt (the default) | small-m kernel | its split |",
                    "| --- | --- | --- | --- | --- | --- |"]
            for r in gemm:
                out.append(f"| {r['m']} | {r['name']} | {r['n']} x {r['k']} | "
                           f"{r['cublas_ms'] * 1e3:.1f} us, {fmt(r['cublas_gbs'])} GB/s "
                           f"({r['cublas_gbs'] / copy:.0%}) | {r['small_m_ms'] * 1e3:.1f} us, "
                           f"{fmt(r['small_m_gbs'])} GB/s ({r['small_m_gbs'] / copy:.0%}) | "
                           f"{r['small_m_plan']} |")
            out.append("")
    summary = record.get("summary", "")
    checks = [line for line in summary.splitlines()
              if re.match(r"(gpu tests|cuda_test|compute-sanitizer|engine memcheck|rep \d)", line)]
    if checks:
        out += ["### Checks", "", "```", *checks, "```", ""]
    steps = [line[len("this: "):] for line in summary.splitlines()
             if re.match(r"this: (dense|1/10 kept)", line)]
    if steps and not (kernels and kernels.get("decode_step_sparse")):
        out += ["### Decode step, Llama-3-8B shape, batch 64 x 4096 (`sieve bench kernels`)", "",
                "```", *steps, "```", ""]
    steps = [line for line in summary.splitlines()
             if re.match(r"(dense|1/10 kept|round) ", line)]
    if steps and not (kernels and kernels.get("decode_step_sparse")):
        out += ["### Decode step rows of the run", "", "```", *steps, "```", ""]
    probes = [line for line in summary.splitlines() if line.startswith("GEMM plan")]
    if probes:
        out += ["### GEMM plans and the programmatic-edge probe (backend/cuda/graph_pdl.h)", "",
                "```", *probes, "```", ""]
    timeline = [line for line in summary.splitlines()
                if re.match(r"timeline (step|kernel|gap|:)", line)]
    if timeline:
        out += ["### Sparse step kernel timeline (`gpu_check.sh timeline`)", "", "```", *timeline,
                "```", ""]
    block = re.search(r"(KV-sparsity pass.*?)(?:\n\n|\Z)", summary, re.S)
    if block:
        out += ["### Score + select + compact (one layer, against the prefill it follows)", "",
                "```", block.group(1).strip(), "```", ""]
    sampling = re.search(r"(GPU sampling.*?)(?:\n==|\nsdpa|\Z)", summary, re.S)
    if sampling:
        out += ["### GPU sampling", "", "```", sampling.group(1).strip(), "```", ""]
    serve = record.get("serve")
    if serve:
        out += ["### Serving: `sieve bench serve` against `sieve serve`", "",
                "| run | requests | output tok/s | TTFT P50 | TTFT P99 | TPOT P50 | TPOT P99 |"
                " ITL P99 |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, result in serve.items():
            if not result:
                continue
            m = result["metrics"]
            out.append(f"| {name} | {m.get('completed')} | {fmt(m['output_throughput'])} | "
                       f"{fmt(m['median_ttft_ms'])} ms | {fmt(m['p99_ttft_ms'])} ms | "
                       f"{m['median_tpot_ms']:.1f} ms | {m['p99_tpot_ms']:.1f} ms | "
                       f"{m['p99_itl_ms']:.1f} ms |")
        if serve.get("dense") and serve.get("sparse"):
            ratio = serve["sparse"]["metrics"]["output_throughput"] / \
                serve["dense"]["metrics"]["output_throughput"]
            out += ["", f"Sparse / dense output throughput: **{ratio:.2f}x**."]
        out.append("")
    cpu = record.get("cpu")
    if cpu:
        out += ["### CPU", "", "```", cpu.strip(), "```", ""]
    return out


def main():
    lines = ["# Benchmark results", "",
             "Generated by `scripts/render_benchmarks.py` from `bench/results/*.json`; do not edit.",
             "How each number is measured: docs/benchmarks.md.", ""]
    for path in sorted(glob.glob(os.path.join(ROOT, "bench", "results", "*.json")), reverse=True):
        lines += render(json.load(open(path)))
    with open(os.path.join(ROOT, "docs", "benchmark_results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote docs/benchmark_results.md")


if __name__ == "__main__":
    main()
