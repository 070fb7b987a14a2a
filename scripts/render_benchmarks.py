#!/usr/bin/env python3
"""Renders docs/benchmarks.md, the results page, from the records bench/results/headline.txt names.

Every number on the page comes from a record (bench/results/NAME.json, written by
scripts/record_gpu_results.py or scripts/bench_cpu.sh); nothing is typed by hand. headline.txt
names one record per benchmark kind (headline, serve, warm-start, prefill-step, decode-step,
tensor-parallel, sampling, kernels, cpu, prefix-cache; the headline may take one record per workload and
GPU, the sweeps of one GPU, model shape and tensor-parallel size rendered as one section; fp8 any
number of records, rendered as one section) and the command that reproduces it;
bench/results/headline_methods.md, hand-written, follows the tables verbatim. The charts are SVG
files in docs/benchmarks/ (scripts/svg_bars.py). Every other record in bench/results/ is the
history of experiments: kept there, not rendered.

  python3 scripts/render_benchmarks.py            # write docs/benchmarks.md and its charts
  python3 scripts/render_benchmarks.py --check    # CI: exit 1 when the page or a chart is stale
  python3 scripts/render_benchmarks_test.py       # its tests (CTest: render_benchmarks_test)
"""
import argparse
import difflib
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import svg_bars  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RESULTS = os.path.join(ROOT, "bench", "results")
PAGE = os.path.join("docs", "benchmarks.md")
CHARTS = os.path.join("docs", "benchmarks")
KINDS = ("headline", "fp8", "prefix-cache", "serve", "warm-start", "prefill-step", "decode-step",
         "tensor-parallel", "sampling", "kernels", "cpu")


def fmt(value, digits=0):
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else str(value)


def read_headline():
    """[(kind, record name, command)] in the file's order; exits on an unknown kind or record."""
    entries = []
    with open(os.path.join(RESULTS, "headline.txt")) as f:
        lines = f.readlines()
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        kind, name, command = (line.split(None, 2) + ["", ""])[:3]
        if kind not in KINDS or not os.path.exists(os.path.join(RESULTS, name + ".json")):
            sys.exit(f"bench/results/headline.txt:{number}: expected KIND RECORD COMMAND with KIND "
                     f"one of {', '.join(KINDS)} and bench/results/RECORD.json present")
        entries.append((kind, name, command))
    return entries


def load_record(name):
    with open(os.path.join(RESULTS, name + ".json")) as f:
        return json.load(f)


def provenance(record, name, command):
    gpu = record.get("gpu") or "not recorded"
    return [f"Record `bench/results/{name}.json`: commit `{record['commit']}`, recorded "
            f"{record['recorded']}, device {gpu}.", f"Reproduce: `{command}`.", ""]


# The headline workloads (scripts/gpu_check.sh headline): input/output lengths and what each
# sparse setting keeps; the targets apply to the Llama-3-8B shape's 4000/500 workload but TTFT and
# of-bound.
HEADLINE_WORKLOADS = (("4k", 4000, 400), ("16k", 16000, 1024))
# The model shapes the headline runs (configs/): "8b" on one GPU, "70b" over several.
SHAPES = {"8b": "Llama-3-8B", "70b": "Llama-3-70B"}


def parse_workload(name):
    """(shape, length, tensor-parallel size) of a headline sweep's workload name, as
    scripts/gpu_check.sh headline writes them (sweep_<workload>_<dense|sparse>.json): "4k" and
    "16k" are the Llama-3-8B shape on one GPU, "70b-4k-tp4" the Llama-3-70B shape over 4. None for
    any other name."""
    found = re.fullmatch(r"(?:(?P<shape>\d+b)-)?(?P<length>\d+k)(?:-tp(?P<tp>\d+))?", name)
    if not found:
        return None
    return found["shape"] or "8b", found["length"], int(found["tp"] or 1)


def workload_name(shape, length, tp):
    """parse_workload's inverse."""
    return length if (shape, tp) == ("8b", 1) else f"{shape}-{length}-tp{tp}"


def below_roofline(bound):
    """Whether a level's roofline (serving_bound.h: decode GEMMs' FLOPs at the GEMM rate where
    they outlast their bytes) is below its bound. Records from before the roofline have none of
    its fields; records after it have them on every level."""
    return bound.get("compute_bound_steps", 0) > 0


def gpu_model(record):
    """The GPU's model as its record names it ("NVIDIA H200"), without driver and clocks."""
    return (record.get("gpu") or "not recorded").split(",")[0].strip()


def gpu_tag(model):
    """A short name for file names: "h200" for "NVIDIA H200", "h100" for "NVIDIA H100 80GB HBM3"."""
    found = re.search(r"[A-Z]\d+", model)
    return found.group(0).lower() if found else re.sub(r"[^a-z0-9]+", "-", model.lower())


def headline_section(record, charts, model, first, shape="8b", tp=1):
    """One GPU's headline of one model shape and tensor-parallel size: `record` holds the sweeps of
    its records (4000/500, 16000/500). The first section describes the benchmark; the others refer
    to it. The issue's targets apply to the Llama-3-8B shape on one GPU."""
    sweeps = record.get("sweeps") or {}
    # The issue's headline: the Llama-3-8B shape on one GPU, with its targets and plain names.
    issue_headline = (shape, tp) == ("8b", 1)
    tag = gpu_tag(model) if issue_headline else f"{gpu_tag(model)}_{shape}-tp{tp}"
    if issue_headline:
        title = f"## The headline on {model}: serving throughput, warm, beside its bound"
        method = ("The same benchmark as in the section above, its ceilings and bounds measured "
                  "in this GPU's runs.")
        if first:
            method = (
                "`sieve bench sweep` against `sieve serve` (Llama-3-8B shape, dummy weights, "
                "warmed up at start, `--max-num-batched-tokens 8192`: sched/README.md has what "
                "the step's token budget trades; 500 output tokens per request, `--ignore-eos`, "
                "two warm-up requests per level), dense (`--kv-policy full`) against sparse "
                "(`full:0-2,pyramidkv:3-31`, window 32). Each level's bound is computed by the "
                "benchmark: every prompt's prefill at the ceilings measured in the same run (the "
                "prefill GEMMs' cuBLASLt rate, causal attention at cuDNN SDPA's) plus every "
                "decode step's weights and KV at the copy rate (tools/bench/serving_bound.h).")
    else:
        title = (f"## The headline of the {SHAPES.get(shape, shape)} shape over {tp} x {model}: "
                 "serving throughput, warm, beside its bound")
        some_bound = next((level["bound"] for sweep in sweeps.values()
                           for level in sweep["levels"] if level.get("bound")), {})
        method = (f"The Llama-3-8B headline's benchmark on the {SHAPES.get(shape, shape)} shape "
                  f"(dummy weights) on {f'{tp} GPUs' if tp > 1 else 'one GPU'} "
                  f"(`--tensor-parallel-size {tp}`), its "
                  "ceilings measured on one of them. Each bound counts one rank's share of every "
                  "prefill's FLOPs and of every decode step's weights and KV, plus the ranks' "
                  "all-reduces (2 a layer, each the step's rows at "
                  f"{fmt(some_bound.get('allreduce_bus_gbs', 0))} GB/s bus bandwidth plus "
                  f"{fmt(some_bound.get('allreduce_latency_us', 0))} us, the rates the bound "
                  "assumes; `sieve bench kernels --tensor-parallel-size N` times them); the last "
                  "column is the all-reduces' share of each bound.")
    out = [title, "", method, ""]
    bounds = [level.get("bound") or {} for sweep in sweeps.values() for level in sweep["levels"]]
    if any(bound.get("kv_pool_pages", 0) > 0 for bound in bounds):
        out[-2] += (" Decode takes at least as many steps as the server's KV pool (its "
                    "`GET /server_info`) allows: where the pool cannot hold a level's sequences "
                    "at once (marked †), the bound adds the steps that costs.")
    past_ridge = [bound for bound in bounds if below_roofline(bound)]
    if past_ridge:
        # 2 FLOPs a bf16 weight of 2 bytes a row: the rows at which FLOPs and bytes take as long.
        ridge = past_ridge[0]["gemm_tflops"] * 1e3 / past_ridge[0]["copy_gbs"]
        out[-2] += (" The bound reads each decode step's weights at the copy rate whatever its "
                    f"rows; past GEMM rate / copy rate rows a step ({ridge:.0f} in this run) the "
                    "GEMMs' FLOPs take longer than their bytes. Where a level has such steps, its "
                    "fraction of the roofline, which counts them at the GEMM rate, follows in "
                    "brackets.")
    targets = []
    for length, input_len, budget in HEADLINE_WORKLOADS:
        name = workload_name(shape, length, tp)
        dense, sparse = sweeps.get(f"{name}_dense"), sweeps.get(f"{name}_sparse")
        if not dense or not sparse:
            out += [f"{input_len}/500: not in this record.", ""]
            continue
        dense_levels = {level["concurrency"]: level for level in dense["levels"]}
        sparse_levels = {level["concurrency"]: level for level in sparse["levels"]}
        levels = sorted(set(dense_levels) & set(sparse_levels))
        out += [f"### {input_len} in / 500 out (sparse budget {budget})", "",
                "| concurrency | dense tok/s | of bound | sparse tok/s | of bound | sparse bound | "
                "sparse / dense | TTFT P50 dense / sparse | TPOT P50 dense / sparse |"
                + (" all-reduces in bound dense / sparse |" if tp > 1 else ""),
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
                + (" ---: |" if tp > 1 else "")]
        values = []
        for concurrency in levels:
            d, p = dense_levels[concurrency], sparse_levels[concurrency]
            dm, pm = d["metrics"], p["metrics"]
            ratio = pm["output_throughput"] / dm["output_throughput"]

            def of_bound(level):
                bound = level["bound"]
                mark = "†" if bound.get("pool_limited_steps", 0) > 0 else ""
                roofline = (f" ({bound['roofline_fraction']:.0%})" if below_roofline(bound)
                            else "")
                return f"{bound['fraction']:.0%}{mark}{roofline}"

            def all_reduce_share(level):
                bound = level["bound"]
                return bound.get("all_reduce_s", 0) / (bound["prefill_s"] + bound["decode_s"])

            out.append(f"| {concurrency} | {fmt(dm['output_throughput'])} | "
                       f"{of_bound(d)} | {fmt(pm['output_throughput'])} | "
                       f"{of_bound(p)} | {fmt(p['bound']['output_throughput'])} | "
                       f"{ratio:.2f}x | {fmt(dm['median_ttft_ms'])} / "
                       f"{fmt(pm['median_ttft_ms'])} ms | {dm['median_tpot_ms']:.1f} / "
                       f"{pm['median_tpot_ms']:.1f} ms |"
                       + (f" {all_reduce_share(d):.0%} / {all_reduce_share(p):.0%} |" if tp > 1
                          else ""))
            values.append([dm["output_throughput"], pm["output_throughput"],
                           p["bound"]["output_throughput"]])
            # What each throughput target asks of the run, against the bounds the same run
            # computed: the share of its bound, and the ratio the two bounds allow.
            if issue_headline and length == "4k" and concurrency == 128:
                tok, bound = pm["output_throughput"], p["bound"]["output_throughput"]
                # The figure beside it (TensorRT-LLM's FP8 engine, 5000/500) is an H200's.
                where = "" if tag == "h200" else ", a target set for an H200"
                targets.append(f"sparse at C=128: {fmt(tok)} output tok/s (target >= 4,000{where}: "
                               f"{'met' if tok >= 4000 else 'missed'}; 4,000 is {4000 / bound:.0%} "
                               f"of this row's bound, {fmt(bound)})")
            if issue_headline and length == "4k" and concurrency == 256:
                bounds_ratio = p["bound"]["output_throughput"] / d["bound"]["output_throughput"]
                rooflines = ""
                if below_roofline(p["bound"]) or below_roofline(d["bound"]):
                    rooflines_ratio = (p["bound"]["roofline_output_throughput"]
                                       / d["bound"]["roofline_output_throughput"])
                    rooflines = f", the two rooflines' {rooflines_ratio:.2f}x"
                targets.append(f"sparse / dense at C=256: {ratio:.2f}x (target >= 1.6x: "
                               f"{'met' if ratio >= 1.6 else 'missed'}; the two bounds' ratio is "
                               f"{bounds_ratio:.2f}x{rooflines})")
            if issue_headline and length == "4k" and concurrency == 20:
                ttft = pm["median_ttft_ms"]
                targets.append(f"TTFT P50 at C=20: {fmt(ttft)} ms sparse, "
                               f"{fmt(dm['median_ttft_ms'])} ms dense (target < 1 s: "
                               f"{'met' if max(ttft, dm['median_ttft_ms']) < 1000 else 'missed'})")
        worst = min(sparse_levels[c]["bound"]["fraction"] for c in levels)
        worst_roofline = ""
        if any(below_roofline(sparse_levels[c]["bound"]) for c in levels):
            lowest = min(sparse_levels[c]["bound"]["roofline_fraction"] for c in levels)
            worst_roofline = f"; against the rooflines, lowest {lowest:.0%}"
        if issue_headline:
            targets.append(f"every sparse row of {input_len}/500 at 85% of its bound or better: "
                           f"lowest {worst:.0%} ({'met' if worst >= 0.85 else 'missed'}"
                           f"{worst_roofline})")
        on = model if issue_headline else f"{tp} x {model}, {SHAPES.get(shape, shape)} shape"
        charts[f"headline_{tag}_{length}.svg"] = svg_bars.bar_chart(
            f"{input_len} in / 500 out on {on}: output tokens/s by concurrency",
            "output tokens/s", [f"C={c}" for c in levels], ["dense", "sparse", "sparse bound"],
            values)
        out += ["", f"![output tokens/s by concurrency, {input_len}/500, {on}](benchmarks/"
                f"headline_{tag}_{length}.svg)", ""]
    if targets:
        out += ["Targets:", ""] + [f"- {target}" for target in targets] + [""]
    return out

# Issue 58's FP8 results: TensorRT-LLM's published Llama-3.1-8B FP8 throughput at 5000/500
# (`trtllm-bench throughput`, 1,500 requests at once), output tok/s, by the card's gpu_tag.
TRTLLM_FP8_5K = {"h200": 3902, "h100": 3459}
# The configurations of scripts/gpu_check.sh fp8_headline, in table order, and what each runs.
FP8_RUNS = {"bf16-dense": "bf16 weights, bf16 KV, dense",
            "fp8-dense": "FP8 weights, bf16 KV, dense",
            "fp8-fp8kv-dense": "FP8 weights, FP8 KV, dense",
            "fp8-sparse": "FP8 weights, bf16 KV, sparse",
            "fp8-fp8kv-sparse": "FP8 weights, FP8 KV, sparse"}
FP8_WORKLOADS = {"5k": 5000, "4k": 4000}
# scripts/gpu_check.sh serve_fp8's runs (record key fp8_WEIGHTS[_fp8kv]_KV_cC): no bound computed.
SERVE_FP8 = re.compile(r"fp8_(none|fp8)(_fp8kv)?_(dense|sparse)_c(\d+)$")


def run_order(run):
    return list(FP8_RUNS).index(run) if run in FP8_RUNS else len(FP8_RUNS)


def of_bound(bound):
    """A level's fraction of its bound, † where the KV pool limits it, and its fraction of the
    roofline in brackets where that is lower."""
    mark = "†" if bound.get("pool_limited_steps", 0) > 0 else ""
    roofline = f" ({bound['roofline_fraction']:.0%})" if below_roofline(bound) else ""
    return f"{bound['fraction']:.0%}{mark}{roofline}"


def fp8_headline_part(runs, model, charts):
    """The fp8_headline sweeps of one GPU: {WORKLOAD_RUN: sweep}. The table of each workload, its
    chart, and issue 58's targets (the 5000/500 ones on the card the run used)."""
    tag = gpu_tag(model)
    out, targets = [], []
    some_bound = next((level["bound"] for sweep in runs.values() for level in sweep["levels"]
                       if level.get("bound")), {})
    if some_bound:
        out += [f"Ceilings measured in the same run: copy {fmt(some_bound['copy_gbs'])} GB/s, "
                f"prefill GEMMs bf16 {fmt(some_bound['gemm_tflops'])} and FP8 "
                f"{fmt(some_bound.get('fp8_gemm_tflops', 0))} TFLOP/s, causal attention "
                f"{fmt(some_bound['attention_tflops'])} TFLOP/s (cuDNN SDPA).", ""]
    fp8_fractions = []
    for workload, input_len in FP8_WORKLOADS.items():
        here = sorted(((name.partition("_")[2], sweep) for name, sweep in runs.items()
                       if name.partition("_")[0] == workload), key=lambda item: run_order(item[0]))
        if not here:
            continue
        out += [f"### {input_len} in / 500 out on {model}" + (
                    ", as `trtllm-bench throughput` runs it" if workload == "5k" else ""), "",
                "| configuration | requests | concurrency | output tok/s | bound | of bound | "
                "TTFT P50 | TPOT P50 |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        labels, values = [], []
        for run, sweep in here:
            for level in sweep["levels"]:
                m, bound = level["metrics"], level.get("bound") or {}
                tok = m["output_throughput"]
                out.append(f"| {run} ({FP8_RUNS.get(run, run)}) | {level['num_prompts']} | "
                           f"{level['concurrency']} | {fmt(tok)} | "
                           f"{fmt(bound.get('output_throughput', '—'))} | "
                           f"{of_bound(bound) if bound else '—'} | {fmt(m['median_ttft_ms'])} ms | "
                           f"{m['median_tpot_ms']:.1f} ms |")
                if run.startswith("fp8") and bound:
                    fp8_fractions.append((bound["fraction"], f"{run} at {input_len}/500, "
                                          f"C={level['concurrency']}"))
                if len(sweep["levels"]) == 1:
                    labels.append(run)
                else:
                    labels.append(f"{run} C={level['concurrency']}")
                values.append([tok, bound.get("output_throughput", 0)])
            if workload != "5k" or len(sweep["levels"]) != 1:
                continue
            tok = sweep["levels"][0]["metrics"]["output_throughput"]
            bound = sweep["levels"][0].get("bound") or {}
            anchor = TRTLLM_FP8_5K.get(tag)
            for target_run, factor, what in (("fp8-dense", 1, "TensorRT-LLM's"),
                                             ("fp8-fp8kv-sparse", 1.5, "1.5x TensorRT-LLM's")):
                if run != target_run:
                    continue
                if anchor is None:
                    targets.append(f"{run} at 5000/500: {fmt(tok)} output tok/s (no TensorRT-LLM "
                                   f"figure for {model})")
                    continue
                goal = factor * anchor
                shown = fmt(math.ceil(goal))
                share = (f"; {shown} is {goal / bound['output_throughput']:.0%} of this row's "
                         f"bound, {fmt(bound['output_throughput'])}") if bound else ""
                targets.append(f"{run} at 5000/500: {fmt(tok)} output tok/s (target >= "
                               f"{shown}, {what} {fmt(anchor)} on this card: "
                               f"{'met' if tok >= goal else 'missed'}{share})")
        charts[f"fp8_{tag}_{workload}.svg"] = svg_bars.bar_chart(
            f"{input_len} in / 500 out on {model}: output tokens/s", "output tokens/s", labels,
            ["measured", "bound"], values)
        out += ["", f"![output tokens/s and bound, {input_len}/500, {model}](benchmarks/"
                f"fp8_{tag}_{workload}.svg)", ""]
    for workload, run in (("5k", "fp8-dense"), ("5k", "fp8-fp8kv-sparse")):
        if f"{workload}_{run}" not in runs:
            targets.append(f"{run} at 5000/500: not in these records")
    if fp8_fractions:
        worst, where = min(fp8_fractions)
        targets.append(f"every FP8 row at 85% of its bound or better: lowest {worst:.0%} "
                       f"({where}; {'met' if worst >= 0.85 else 'missed'})")
    return out, targets


def fp8_serve_part(serve):
    """scripts/gpu_check.sh serve_fp8's runs (no bound: that stage passes no --bound-* flags)."""
    rows = []
    for name, result in serve.items():
        match = SERVE_FP8.match(name)
        if match and result:
            weights, fp8kv, kv, concurrency = match.groups()
            run = f"{'fp8' if weights == 'fp8' else 'bf16'}{'-fp8kv' if fp8kv else ''}-{kv}"
            rows.append((run_order(run), int(concurrency), run, result))
    if not rows:
        return []
    dataset = rows[0][3]["config"]["dataset"]
    out = [f"`sieve bench serve` at {dataset['input_len']}/{dataset['output_len']} "
           "(`scripts/gpu_check.sh serve_fp8`, 2C prompts a level, one warm-up request). That "
           "stage computes no bound: these rows have none; `fp8_headline` runs the same "
           "configurations beside their bounds.", "",
           "| configuration | concurrency | requests | output tok/s | TTFT P50 | TPOT P50 |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for _, concurrency, run, result in sorted(rows):
        m = result["metrics"]
        out.append(f"| {run} ({FP8_RUNS.get(run, run)}) | {concurrency} | {m.get('completed')} | "
                   f"{fmt(m['output_throughput'])} | {fmt(m['median_ttft_ms'])} ms | "
                   f"{m['median_tpot_ms']:.1f} ms |")
    return out + [""]


def fp8_decode_step_part(kernels_kv_cache, targets):
    """The decode step with FP8 weights, bf16 against FP8 KV (scripts/gpu_check.sh kv_fp8)."""
    out = ["The decode step (`sieve bench kernels`, batch 64 x 4096 context, dense or 1/10 of the "
           "context kept, CUDA graph, device time) with FP8 weights, beside its byte bound (the "
           "weights and KV entries it must read at the copy rate measured in the same run):", "",
           "| weights | KV | kept | step | bound | step / bound | tok/s |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for dtype in ("auto", "fp8"):
        kernels = kernels_kv_cache.get(dtype)
        if not kernels:
            continue
        weights = "FP8" if kernels.get("quantization") == "fp8" else "bf16"
        kv = "FP8" if dtype == "fp8" else "bf16"
        for key in ("decode_step_dense", "decode_step_sparse"):
            step = kernels.get(key)
            if not step:
                continue
            kept = "all" if step["kept_fraction"] == 1.0 else f"{step['kept_fraction']:.0%}"
            out.append(f"| {weights} | {kv} | {kept} | {step['step_ms']:.2f} ms | "
                       f"{step['bound_ms']:.2f} ms ({step['bytes'] / 1e9:.1f} GB) | "
                       f"{step['ratio']:.2f}x | {fmt(step['tokens_per_second'])} |")
            if weights == "FP8" and kv == "FP8" and step["kept_fraction"] < 1.0:
                targets.append(f"the batch-64 x 4k decode step with FP8 weights and FP8 KV, "
                               f"{kept} kept: {step['ratio']:.2f}x its byte bound (target <= "
                               f"1.2x: {'met' if step['ratio'] <= 1.2 else 'missed'})")
    return out + [""]


def fp8_weights_part(kernels):
    """The prefill step with FP8 weights and the layer's GEMMs bf16 against FP8 by rows
    (scripts/gpu_check.sh fp8)."""
    out = []
    dense = kernels.get("prefill_step_dense")
    if dense:
        rate = dense["gemm_flops"] / (dense["gemm_bound_ms"] * 1e-3) / 1e12
        out += [f"The prefill step with FP8 weights ({dense['num_seqs']} x {dense['prompt_len']} "
                "tokens, `--prefill-step --quantization fp8`): "
                f"{dense['step_ms']:.1f} ms against {dense['gemm_bound_ms']:.1f} ms of its GEMMs "
                f"alone ({dense['fraction_of_bound']:.0%}; attention not counted), the GEMMs at "
                f"{fmt(rate)} TFLOP/s: the FP8 rate the serving bound takes.", ""]
    gemms = kernels.get("fp8_gemm") or []
    by_rows = {}
    for gemm in gemms:
        totals = by_rows.setdefault(gemm["m"], [0.0, 0.0])
        totals[0] += gemm["bf16_ms"]
        totals[1] += gemm["fp8_ms"]
    if by_rows:
        out += ["One layer's GEMMs (qkv, o, gate_up, down), bf16 against FP8 weights (activations "
                "quantized per token as they run), by rows:", "",
                "| rows | bf16 | FP8 | bf16 / FP8 |", "| ---: | ---: | ---: | ---: |"]
        for rows, (bf16, fp8) in sorted(by_rows.items()):
            out.append(f"| {rows} | {bf16 * 1e3:.1f} us | {fp8 * 1e3:.1f} us | {bf16 / fp8:.2f}x |")
        out.append("")
    return out


def fp8_section(sources, charts):
    """Issue 58's results from every `fp8` record: [(record, name, command)]. The fp8_headline
    sweeps of each GPU beside their bounds with the targets, then what the other FP8 records hold
    (serve_fp8 runs, the decode step, the prefill step and GEMMs), each under its provenance."""
    out = ["## FP8 weights and KV cache: serving beside its bound (issue 58)", "",
           "`sieve serve --quantization fp8` quantizes the layers' linear weights to e4m3 (a scale "
           "an output channel; embeddings and LM head bf16) and `--kv-cache-dtype fp8` stores the "
           "KV cache as e4m3. The headline runs (`scripts/gpu_check.sh fp8_headline`) serve the "
           "Llama-3.1-8B shape (dummy weights, `--max-num-batched-tokens 8192`, `--ignore-eos`, "
           "two warm-up requests) in each configuration: dense `--kv-policy full`, sparse "
           "`full:0-2,pyramidkv:3-31` (budget 400, window 32). Each row's bound "
           "(tools/bench/serving_bound.h) counts the FP8 weights at 1 byte (plus their scales) "
           "in every decode step, the layers' prefill GEMMs at the FP8 GEMM rate measured in the "
           "same run, and FP8 KV at 1 byte an element; † marks a row whose bound the KV pool "
           "limits, and the roofline's fraction follows in brackets where decode GEMMs' FLOPs "
           "outlast their bytes.", ""]
    targets = []
    groups = {}  # GPU model -> {WORKLOAD_RUN: sweep}, and its sources
    for record, name, command in sources:
        if record.get("fp8_headline"):
            group = groups.setdefault(gpu_model(record), {"runs": {}, "sources": []})
            group["runs"].update(record["fp8_headline"])
            group["sources"].append((record, name, command))
    for model, group in groups.items():
        out += [f"### {model}", ""]
        for record, name, command in group["sources"]:
            out += provenance(record, name, command)
        part, found = fp8_headline_part(group["runs"], model, charts)
        out += part
        targets += [f"{model}: {target}" for target in found]
    for record, name, command in sources:
        if record.get("fp8_headline"):
            continue
        parts = fp8_serve_part(record.get("serve") or {})
        if record.get("kernels_kv_cache"):
            parts += fp8_decode_step_part(record["kernels_kv_cache"], targets)
        quantized = (record.get("kernels_quantization") or {}).get("fp8")
        if quantized:
            parts += fp8_weights_part(quantized)
        if parts:
            out += [f"### {gpu_model(record)}: `{name}`", ""] + provenance(record, name, command)
            out += parts
    if not groups:
        targets.append("FP8 dense and FP8 + FP8-KV sparse at 5000/500 (`scripts/gpu_check.sh "
                       "fp8_headline`): no record yet")
    if targets:
        out += ["Targets (issue 58), on the card each run used:", ""]
        out += [f"- {target}" for target in targets] + [""]
    return out



def tensor_parallel_section(record, charts):
    runs = record.get("kernels_tp") or {}
    size, kernels = next(iter(sorted(runs.items())))
    rows = kernels["tensor_parallel_plan"]
    first = rows[0]
    out = ["## Tensor parallelism: the decode step's bound of a Llama-3-70B shape", "",
           f"What one rank of a Llama-3-70B-shaped model (bf16) must move in a decode step of batch "
           f"{first['batch']} x {first['context']} context, dense or with 1/10 of the context kept "
           "(model/tensor_parallel.h): its weights and KV at the copy rate measured in the same run, "
           "plus its all-reduces (2 a layer, each the batch's residual rows) at an assumed NCCL "
           "ring bus bandwidth of 370 GB/s and 8 us each (NVLink 4 without NVLink SHARP) until a "
           "run on that many GPUs measures them (`--tensor-parallel-size N`). \"held\" is the "
           "rank's weights and KV in memory; the last column is the bound with the LM head split "
           "by vocabulary instead of replicated.", "",
           "| KV | TP | held / rank | fits one H200 | memory | all-reduces | bound | tok/s | "
           "vocab-parallel LM head |",
           "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        label = "dense" if row["kept_fraction"] == 1.0 else "1/10 kept"
        out.append(f"| {label} | {row['tensor_parallel_size']} | {row['held_bytes'] / 1e9:.1f} GB | "
                   f"{row['fits']} | {row['memory_ms']:.2f} ms | {row['collective_ms']:.2f} ms | "
                   f"{row['bound_ms']:.2f} ms | {fmt(row['bound_tokens_per_second'])} | "
                   f"{row['vocab_parallel_bound_ms']:.2f} ms |")
    steps = [(key, kernels[key]) for key in ("decode_step_dense_tp", "decode_step_sparse_tp")
             if key in kernels]
    if steps:
        out += ["", f"The Llama-3-8B decode step split over {size} rank(s) through NCCL "
                "(`--tensor-parallel-size`), beside the plain step of the same run:", "",
                "| KV | TP | step | plain step | bound (one rank) |", "| --- | ---: | ---: | ---: | ---: |"]
        for key, step in steps:
            plain = kernels.get(key.removesuffix("_tp"), {})
            label = "dense" if step["kept_fraction"] == 1.0 else "1/10 kept"
            out.append(f"| {label} | {step['tensor_parallel_size']} | {step['step_ms']:.2f} ms | "
                       f"{plain.get('step_ms', 0):.2f} ms | {step['bound_ms']:.2f} ms |")
    out.append("")
    return out



def serve_section(record, charts):
    out = ["## Serving: `sieve bench serve` against `sieve serve`", ""]
    runs = {name: result for name, result in record["serve"].items() if result}
    config = next(iter(runs.values()))["config"]
    dataset = config["dataset"]
    out += [f"Llama-3-8B shape with dummy weights, {dataset['num_prompts']} random prompts of "
            f"{dataset['input_len']} tokens, {dataset['output_len']} output tokens each "
            f"(`--ignore-eos`), at most {config['max_concurrency']} requests in flight; dense "
            "(`--kv-policy full`) against sparse (`full:0-2,pyramidkv:3-31`, budget 400, window "
            "32).", "",
            "| KV | requests | output tok/s | TTFT P50 | TTFT P99 | TPOT P50 | TPOT P99 | ITL P99 |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, result in runs.items():
        m = result["metrics"]
        out.append(f"| {name} | {m.get('completed')} | {fmt(m['output_throughput'])} | "
                   f"{fmt(m['median_ttft_ms'])} ms | {fmt(m['p99_ttft_ms'])} ms | "
                   f"{m['median_tpot_ms']:.1f} ms | {m['p99_tpot_ms']:.1f} ms | "
                   f"{m['p99_itl_ms']:.1f} ms |")
    if runs.get("dense") and runs.get("sparse"):
        ratio = runs["sparse"]["metrics"]["output_throughput"] / \
            runs["dense"]["metrics"]["output_throughput"]
        out += ["", f"Sparse / dense output throughput: **{ratio:.2f}x**."]
    charts["serve.svg"] = svg_bars.bar_chart(
        "Serving: output tokens/s", "output tokens/s", list(runs), ["output tok/s"],
        [[result["metrics"]["output_throughput"]] for result in runs.values()])
    out += ["", "![output tokens/s, dense and sparse](benchmarks/serve.svg)", ""]
    return out


def prefix_cache_section(record, charts):
    """Issue 60: `scripts/gpu_check.sh prefix_cache` runs, prefix caching on against off on one
    server each, per workload, KV policy and level, with the issue's targets."""
    out = ["## Prefix caching: cache on against off (issue 60)", "",
           "`sieve serve` (Llama-3-8B shape, dummy weights, bf16, `--max-num-batched-tokens "
           "8192`) with `--enable-prefix-caching` (the default) against "
           "`--no-enable-prefix-caching`, a fresh server each, dense (`--kv-policy full`) and "
           "sparse (`full:0-2,pyramidkv:3-31`, budget 400, window 32). Workloads: *shared*, one "
           "2,000-token prefix shared by every request with a 200-token suffix of its own and 200 "
           "tokens out (`--dataset-name prefix-repetition`), at each level's concurrency on the "
           "same server; *turns*, 10-turn conversations all at once, a 1,000-token first message "
           "and 200-token messages after it, 200 tokens out a turn (`--dataset-name multi-turn`). "
           "Hit rate: `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` over the "
           "run.", "",
           "| workload | KV | C | output tok/s, on / off | TTFT P50, on / off | hit rate |",
           "| --- | --- | --- | --- | --- | --- |"]
    runs = {}  # (workload, level) -> {kind: {cache: result}}
    for name, result in (record.get("prefix_cache") or {}).items():
        found = re.fullmatch(r"(?P<workload>\w+?)_(?P<kind>dense|sparse)_(?P<cache>on|off)"
                             r"(?:_c(?P<level>\d+))?", name)
        if not found or not result:
            continue
        level = found["level"] or str(result["config"].get("max_concurrency") or "all")
        runs.setdefault((found["workload"], level), {}).setdefault(
            found["kind"], {})[found["cache"]] = result
    targets = []
    for (workload, level), kinds in sorted(runs.items(), key=lambda item: (
            item[0][0], int(item[0][1]) if item[0][1].isdigit() else 1 << 30)):
        for kind in ("dense", "sparse"):
            pair = kinds.get(kind) or {}
            on, off = pair.get("on"), pair.get("off")
            if not on:
                continue
            m_on = on["metrics"]
            hit = (on.get("prefix_cache") or {}).get("hit_rate")
            hit_text = f"{hit:.1%}" if isinstance(hit, (int, float)) else "none"
            if off:
                m_off = off["metrics"]
                speedup = m_on["output_throughput"] / m_off["output_throughput"]
                ttft = m_on["median_ttft_ms"] / m_off["median_ttft_ms"]
                out.append(f"| {workload} | {kind} | {level} | {fmt(m_on['output_throughput'])} / "
                           f"{fmt(m_off['output_throughput'])} (**{speedup:.2f}x**) | "
                           f"{fmt(m_on['median_ttft_ms'])} / {fmt(m_off['median_ttft_ms'])} ms "
                           f"(**{ttft:.2f}x**) | {hit_text} |")
                if workload == "shared":
                    targets.append(
                        f"{workload}, {kind}, C={level}: TTFT P50 {ttft:.2f}x of cache-off (target "
                        f"<= 0.3x: {'met' if ttft <= 0.3 else 'missed'}); output {speedup:.2f}x "
                        f"(target >= 1.5x: {'met' if speedup >= 1.5 else 'missed'})")
            else:
                out.append(f"| {workload} | {kind} | {level} | {fmt(m_on['output_throughput'])} / "
                           f"- | {fmt(m_on['median_ttft_ms'])} / - ms | {hit_text} |")
        dense_on = (kinds.get("dense") or {}).get("on")
        sparse_on = (kinds.get("sparse") or {}).get("on")
        if dense_on and sparse_on:
            lead = sparse_on["metrics"]["output_throughput"] / \
                dense_on["metrics"]["output_throughput"]
            targets.append(f"{workload}, C={level}: sparse / dense output with the cache on "
                           f"{lead:.2f}x (target: sparse keeps its lead: "
                           f"{'met' if lead > 1 else 'missed'})")
    turns = [(kind, cache, result) for (workload, _), kinds in runs.items() if workload == "turns"
             for kind, pair in kinds.items() for cache, result in pair.items()
             if result.get("multi_turn")]
    if turns:
        out += ["", "Conversations, TTFT P50 of the first turns and of the later ones (which "
                "extend the last turn's prompt and answer):", "",
                "| KV | cache | first turns | later turns |", "| --- | --- | --- | --- |"]
        for kind, cache, result in sorted(turns, key=lambda t: (t[0], t[1] != "on")):
            split = result["multi_turn"]
            out.append(f"| {kind} | {cache} | {fmt(split['median_ttft_ms_first_turns'])} ms | "
                       f"{fmt(split['median_ttft_ms_later_turns'])} ms |")
    if targets:
        out += ["", "Targets (issue 60), on the card the run used:", ""]
        out += [f"- {target}" for target in targets]
    return out + [""]


def warm_start_section(record, charts):
    out = ["## Warm start: a fresh server's first benchmark against its second", "",
           "`sieve serve` (Llama-3-8B shape, dummy weights, `full:0-2,pyramidkv:3-31`, budget 400) "
           "started fresh, then `sieve bench serve` twice in a row (4000/500, 256 prompts, at most "
           "128 in flight, no warm-up requests): with the start-up warm-up (the default: decode "
           "graphs captured and step-tuned, prefill GEMMs planned before `/health` answers 200) "
           "and without it (`--no-warm-up`: all of that on first use, while requests wait).", "",
           "| warm-up | run | output tok/s | TTFT P50 | ITL max |", "| --- | --- | --- | --- | --- |"]
    serve = record["serve"]
    ratios = []
    for mode, label in (("on", "at start-up"), ("off", "`--no-warm-up`")):
        runs = [serve.get(f"warm_{mode}_{run}") for run in ("first", "second")]
        if not all(runs):
            continue
        for run, result in zip(("first", "second"), runs):
            m = result["metrics"]
            out.append(f"| {label} | {run} | {fmt(m['output_throughput'])} | "
                       f"{fmt(m['median_ttft_ms'])} ms | {fmt(m['max_itl_ms'])} ms |")
        ratio = runs[0]["metrics"]["output_throughput"] / runs[1]["metrics"]["output_throughput"]
        ratios.append((label, ratio))
    out.append("")
    for label, ratio in ratios:
        met = "met" if ratio >= 0.97 else "missed"
        out.append(f"- Warm-up {label}: first / second run **{ratio:.3f}** (target >= 0.97: {met}).")
    warm = re.search(r"warm-up done in ([\d.]+) s: (\d+) decode graphs \((\d+) batch buckets x (\d+) "
                     r"length bounds\), (\d+) prefill sizes", record.get("summary", ""))
    if warm:
        out.append(f"- The warm-up took {warm.group(1)} s: {warm.group(2)} decode graphs "
                   f"({warm.group(3)} batch buckets x {warm.group(4)} length bounds) and "
                   f"{warm.group(5)} prefill sizes.")
    out.append("")
    return out


def prefill_step_section(record, charts):
    runs = record.get("prefill_runs") or {}
    # An A/B record: this tree's first run; else the plain run's kernels.json.
    name = next((key for key in runs if key.startswith("tree")), None)
    kernels = runs[name] if name else record["kernels"]
    dense, sparse = kernels["prefill_step_dense"], kernels["prefill_step_sparse"]
    out = ["## The prefill step: `sieve bench kernels --prefill-step`", "",
           f"{dense['num_seqs']} prompts of {dense['prompt_len']} tokens in one engine step "
           "(Llama-3-8B shape, dummy weights, warmed up as `sieve serve` is; host time of the "
           "step, median of 5), beside its compute bound: the step's GEMMs at the rate cuBLASLt "
           "reaches on each of those shapes alone, plus its causal attention at cuDNN SDPA's rate "
           f"({fmt(dense['attention_tflops'])} TFLOP/s, PyTorch in the same run).", "",
           "| KV | step | tok/s | bound (GEMMs + attention) | of the bound | target |",
           "| --- | --- | --- | --- | --- | --- |"]
    for label, row in (("dense", dense), ("sparse", sparse)):
        met = "met" if row["fraction_of_bound"] >= 0.85 else "missed"
        out.append(f"| {label} | {row['step_ms']:.1f} ms | {fmt(row['tokens_per_second'])} | "
                   f"{row['bound_ms']:.1f} ms ({row['gemm_bound_ms']:.1f} + "
                   f"{row['attention_bound_ms']:.1f}) | {row['fraction_of_bound']:.0%} | "
                   f">= 85%: {met} |")
    out += ["", "| GEMM | m x n x k | alone | TFLOP/s | calls a step |",
            "| --- | --- | --- | --- | --- |"]
    for gemm in dense["gemms"]:
        # Records before the calls field ran every GEMM once a layer.
        calls = gemm.get("calls", "one a layer")
        out.append(f"| {gemm['name']} | {gemm['m']} x {gemm['n']} x {gemm['k']} | "
                   f"{gemm['ms_alone']:.3f} ms | {fmt(gemm['tflops'])} | {calls} |")
    # The sparse step's kernels on a timeline (tools/kernel_timeline), summed by kind.
    summary = record.get("summary", "")
    if name:
        number = name.rsplit("_", 1)[-1]
        block = re.search(rf"prefill run {number}:.*?(?=\nprefill run |\Z)", summary, re.S)
        summary = block.group(0) if block else ""
    kinds = re.findall(r"^timeline kernel (\S+)\s+x\s*(\d+)\s+mean\s+([\d.]+) us\s+total ([\d.]+) ms",
                       summary, re.M)
    if kinds:
        out += ["", "Where the sparse step's time goes (its kernels on a GPU timeline, summed by "
                "kind; `nvjet` kernels are cuBLASLt's GEMMs):", "",
                "| kernel | calls | total |", "| --- | --- | --- |"]
        for kernel, calls, _, total in kinds[:10]:
            out.append(f"| `{kernel}` | {calls} | {float(total):.1f} ms |")
        def short(kernel):  # "nvjet_sm90_tst_168x128_..." -> "GEMM 168x128"; "...Kernel" cut
            tile = re.match(r"nvjet_sm\d+_\w+?_(\d+x\d+)_", kernel)
            return f"GEMM {tile.group(1)}" if tile else kernel.removesuffix("Kernel")[:18]
        charts["prefill_step.svg"] = svg_bars.bar_chart(
            "Prefill step (sparse): time by kernel", "milliseconds",
            [short(k[0]) for k in kinds[:8]], ["total"], [[float(k[3])] for k in kinds[:8]],
            number=lambda v: f"{v:.1f} ms")
        out += ["", "![prefill step time by kernel](benchmarks/prefill_step.svg)"]
    out.append("")
    return out


STEP_ROW = re.compile(r"^(?:this: )?(dense|1/10 kept)\s+step\s+([\d.]+) ms \(host\s+([\d.]+)\)\s+"
                      r"bound\s+([\d.]+) ms \(([\d.]+) GB at the copy rate\)\s+([\d.]+)x the bound"
                      r"\s+(\d+) tok/s")


def decode_step_section(record, charts):
    rows = []
    for line in record["summary"].splitlines():
        match = STEP_ROW.match(line)
        if match and match.group(1) not in [row[0] for row in rows]:
            rows.append(match.groups())
    out = ["## The decode step: `sieve bench kernels`", "",
           "Llama-3-8B shape with dummy weights, batch 64, 4096 entries of context per sequence "
           "(dense) or 1/10 of them kept in every layer, captured as a CUDA graph and step-tuned "
           "as the engine does; device time by CUDA events. The bound is the bytes the step must "
           "read (weights except the embedding table, plus the KV entries) at the copy rate "
           "measured in the same run.", "",
           "| KV | step (device) | host replay | bound | step / bound | tok/s | target |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, step, host, bound, gigabytes, ratio, tokens in rows:
        met = "met" if float(ratio) <= 1.3 else "missed"
        out.append(f"| {name} | {step} ms | {host} ms | {bound} ms ({gigabytes} GB) | {ratio}x | "
                   f"{fmt(int(tokens))} | <= 1.3x: {met} |")
    charts["decode_step.svg"] = svg_bars.bar_chart(
        "Decode step, batch 64: time against its bound", "milliseconds",
        [row[0] for row in rows], ["step", "bound"],
        [[float(row[1]), float(row[3])] for row in rows], number=lambda v: f"{v:.2f} ms")
    out += ["", "![decode step time beside its bound](benchmarks/decode_step.svg)", ""]
    return out


def kernels_section(record, charts):
    kernels = record["kernels"]
    copy = kernels["copy_bandwidth_gbs"]
    out = ["## Kernels: `sieve bench kernels`", "",
           "| ceiling measured in the same run | value |", "| --- | --- |",
           f"| device-to-device copy (read + write) | {fmt(copy)} GB/s |",
           f"| bf16 GEMM 8192^3 (cuBLASLt) | {fmt(kernels['gemm_tflops'])} TFLOP/s |", "",
           "| kernel | time | achieved | bar (PERF.md) | vs bar |", "| --- | --- | --- | --- | --- |"]
    prefill = []
    for row in kernels.get("attention", []):
        if row["target"]:
            bar = f"{fmt(row['target'])} {row['unit']} ({row['target_note']})"
            versus = f"{row['value'] / row['target']:.0%}"
        else:
            bar, versus = "—", f"{row['value'] / row['bound']:.0%} of the ceiling"
        out.append(f"| {row['name']} | {row['median_ms']:.3f} ms | {fmt(row['value'])} "
                   f"{row['unit']} | {bar} | {versus} |")
        match = re.match(r"prefill causal n=(\d+).* (d\d+)", row["name"])
        if match and "sm_80 kernel" not in row["name"]:  # the chart shows what the engine runs
            prefill.append((f"n={match.group(1)} {match.group(2)}", row["value"], row["target"]))
    sdpa = [r for r in (record.get("sdpa") or {}).get("results", [])
            if r.get("backend") == "cudnn" and "tflops" in r]
    if sdpa and prefill:
        # Issue 19's bar for prefill attention: 0.9x of cuDNN SDPA timed in the same run.
        out += ["", "Beside cuDNN SDPA timed in the same run (`scripts/sdpa_bench.py`, PyTorch):", "",
                "| prefill | ours | cuDNN SDPA | ours / cuDNN |", "| --- | --- | --- | --- |"]
        for label, value, _ in prefill:
            n, d = re.match(r"n=(\d+) d(\d+)", label).groups()
            match = [r for r in sdpa if r["n"] == int(n) and r.get("d", 128) == int(d)]
            if match:
                theirs = match[0]["tflops"]
                out.append(f"| causal {label} | {fmt(value)} TFLOP/s | {fmt(theirs)} TFLOP/s | "
                           f"{value / theirs:.2f}x |")
    if prefill:
        charts["prefill_attention.svg"] = svg_bars.bar_chart(
            "Prefill attention, causal (32 q / 8 kv heads)", "TFLOP/s", [p[0] for p in prefill],
            ["ours", "bar (the table's)"], [[p[1], p[2]] for p in prefill])
        out += ["", "![prefill attention TFLOP/s beside its bar](benchmarks/prefill_attention.svg)"]
    gemm = kernels.get("gemm")
    if gemm:
        out += ["", "GEMMs at decode batch sizes: weights streamed cold, calls back to back in a "
                "CUDA graph; GB/s of weights and the fraction of the copy rate, as the backend's GEMM "
                "runner (cuBLASLt) plans them.", "",
                "| m | GEMM | n x k | cuBLASLt |",
                "| --- | --- | --- | --- |"]
        for r in gemm:
            out.append(f"| {r['m']} | {r['name']} | {r['n']} x {r['k']} | "
                       f"{r['cublas_ms'] * 1e3:.1f} us, {fmt(r['cublas_gbs'])} GB/s "
                       f"({r['cublas_gbs'] / copy:.0%}) |")
    summary = record.get("summary", "")
    # The sampler has its own section (kind `sampling`).
    block = re.search(r"(KV-sparsity pass.*?)(?:\n\n|\Z)", summary, re.S)
    if block:
        out += ["", "Score + select + compact (one layer, against the prefill it follows):", "",
                "```", block.group(1).strip(), "```"]
    out.append("")
    return out


def sampling_section(record, charts):
    """The GPU sampler's table from `sieve bench kernels` output saved in the record (the last
    one found: an A/B record's winner is benched last)."""
    out = ["## GPU sampling: `sieve bench kernels`", "",
           "`SampleTokens` (backend/cuda/sampling_kernels.h) on rows of 128,256 logits, "
           "microseconds a step for 1, 64 and 256 rows in each mode the table's header names "
           "(greedy, and of top-k, top-p, top-k + top-p and min-p those the record's benchmark "
           "ran; the target is 60 us at 64 rows, each mode).", ""]
    texts = list((record.get("outputs") or {}).values()) + [record.get("summary", "")]
    found = None
    for text in texts:
        for block in re.finditer(r"(GPU sampling, vocab.*?)(?:\n==|\n\n|\Z)", text, re.S):
            found = block.group(1).strip()
    out += ["```", found, "```", ""] if found else ["No sampling table in this record.", ""]
    return out


def cpu_section(record, charts):
    return ["## CPU: `scripts/bench_cpu.sh`", "",
            "`sieve bench cpu`: the machine's measured ceilings (fp32 FMA peak, the CPU "
            "backend's best fp32 GEMM rate, read bandwidth), then the default model's prefill "
            "(a batch of prompts in one engine, as `sieve eval` runs them, beside the GEMM rate: "
            "target half of it) and decode (beside its roofline). Then the reference backend's "
            "decode speed on random models beside the bound of streaming its f32 weights once "
            "per token, and the host time of one engine step (scheduling + building the step's "
            "metadata) with 256 decoding sequences x 32 layers.", "",
            "```", record["cpu"].strip(), "```", ""]


# Every kind but the headline, which render() takes a GPU at a time.
SECTIONS = {"serve": serve_section, "prefix-cache": prefix_cache_section,
            "warm-start": warm_start_section, "prefill-step": prefill_step_section,
            "decode-step": decode_step_section, "tensor-parallel": tensor_parallel_section,
            "sampling": sampling_section,
            "kernels": kernels_section, "cpu": cpu_section}


def render():
    """The page's text and {chart file name: SVG text}."""
    charts = {}
    lines = ["# Benchmarks", "",
             "<!-- Generated by scripts/render_benchmarks.py from the records named in "
             "bench/results/headline.txt; do not edit. -->", "",
             "The current numbers, one record per kind of benchmark. Each section names its record "
             "in `bench/results/` (the JSON holds the commit, the device and the full output) and "
             "the command that reproduces it. The other records there are the history of "
             "experiments; code comments cite them by file name.", ""]
    entries = read_headline()
    headline_done = fp8_done = False
    for kind, name, command in entries:
        if kind == "fp8":
            # Every fp8 record makes one section, at the first one's place.
            if not fp8_done:
                fp8_done = True
                lines += fp8_section([(load_record(n), n, c) for k, n, c in entries if k == "fp8"],
                                     charts)
            continue
        if kind == "headline":
            # The headline records of one GPU, model shape and tensor-parallel size (one run for
            # 4000/500, another for 16000/500) make one section: their sweeps together, each
            # record's provenance; a section per such group, in the order of their first records.
            if headline_done:
                continue
            headline_done = True
            groups = {}  # (GPU model, shape, tp) -> {"sweeps": {...}, "sources": [...]}
            for k, n, c in entries:
                if k != "headline":
                    continue
                record = load_record(n)
                for sweep_name, sweep in (record.get("sweeps") or {}).items():
                    workload = parse_workload(sweep_name.rpartition("_")[0])
                    if workload is None:
                        sys.exit(f"bench/results/{n}.json: sweep {sweep_name} is no headline "
                                 "workload (4k, 16k, 70b-4k-tp4, ...: parse_workload)")
                    shape, _, tp = workload
                    group = groups.setdefault((gpu_model(record), shape, tp),
                                              {"sweeps": {}, "sources": []})
                    group["sweeps"][sweep_name] = sweep
                    if n not in [source[1] for source in group["sources"]]:
                        group["sources"].append((record, n, c))
            for index, ((model, shape, tp), group) in enumerate(groups.items()):
                section = headline_section(group, charts, model, first=index == 0, shape=shape,
                                           tp=tp)
                lines += section[:2]
                for record, n, c in group["sources"]:
                    lines += provenance(record, n, c)
                lines += section[2:]
            continue
        record = load_record(name)
        section = SECTIONS[kind](record, charts)
        lines += section[:2] + provenance(record, name, command) + section[2:]
    with open(os.path.join(RESULTS, "headline_methods.md")) as f:
        methods = f.read()
    if methods.startswith("<!--"):  # the file's own note on what it is
        methods = methods[methods.index("-->") + 3:]
    lines.append(methods.strip("\n"))
    return "\n".join(lines) + "\n", charts


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when docs/benchmarks.md or a chart differs "
                        "from what the records render to")
    args = parser.parse_args()
    page, charts = render()
    files = {PAGE: page, **{os.path.join(CHARTS, name): svg for name, svg in charts.items()}}
    if args.check:
        stale = []
        for path, text in files.items():
            current = open(os.path.join(ROOT, path)).read() if os.path.exists(
                os.path.join(ROOT, path)) else ""
            if current != text:
                stale.append(path)
                sys.stdout.writelines(difflib.unified_diff(
                    current.splitlines(True), text.splitlines(True), path, path + " (rendered)",
                    n=1))
        if stale:
            print(f"stale: {', '.join(stale)}; run python3 scripts/render_benchmarks.py")
            return 1
        print(f"{PAGE} and {len(charts)} charts match their records")
        return 0
    os.makedirs(os.path.join(ROOT, CHARTS), exist_ok=True)
    for path, text in files.items():
        with open(os.path.join(ROOT, path), "w") as f:
            f.write(text)
    print(f"wrote {PAGE} and {len(charts)} charts in {CHARTS}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
