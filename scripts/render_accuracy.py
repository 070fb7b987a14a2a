#!/usr/bin/env python3
"""Renders docs/accuracy.md from the `sieve eval --result-json` records in bench/results/accuracy/.

Every number on the page comes from those records; nothing is typed by hand. A record is NAME.json,
or NAME.json.gz (gzip: records of many samples, kept small so that the tree travels to the GPU
machine within its size limit; `gzip -9 -n NAME.json` makes one). A record may have a
hand-written sidecar NAME.md next to it (the command that produced it, the machine), included
verbatim under the record's section, and charts in docs/accuracy/NAME/ (a
`sieve eval --plot-dir` folder, copied there with --copy-plots NAME=PLOT_DIR), shown as images.
Records are listed in the order of page_order.txt in the records' folder (one file stem a line),
then the others newest first by file name; records in its subfolders (history/) are not rendered.
Records of one run at several weight / KV cache precisions (`--quantization`, `--kv-cache-dtype`;
every other setting equal) are compared in one table, in the section of the unquantized one.

  python3 scripts/render_accuracy.py                                   # write docs/accuracy.md
  python3 scripts/render_accuracy.py --copy-plots NAME=/tmp/plots      # copy charts, then write
  python3 scripts/render_accuracy.py --check                           # CI: exit 1 when stale
"""
import argparse
import difflib
import glob
import gzip
import json
import os
import shutil
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PERPLEXITY = "perplexity"
TRANSPOSE_ABOVE = 8  # summary tables with more configurations than this have a row per config


def pct(value):
    return f"{100.0 * value:.1f}"


def fmt_number(value):
    """1000 -> 1000, 0.5 -> 0.5, 1.0 -> 1 (lengths, depths)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def cell_text(cell):
    """A cell's or a summary's value as the page shows it: score in %, perplexity as is."""
    if cell is None or not cell.get("samples"):
        return "–"
    if "perplexity" in cell:
        text = f"{cell['perplexity']:.2f}"
    else:
        text = pct(cell.get("score", 0.0))
    return text + ("*" if cell.get("errors") else "")


def table(header, rows, align=None):
    """A Markdown table; `align` is "l" or "r" per column (default: first left, rest right)."""
    align = align or ["l"] + ["r"] * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |",
           "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def sanitize_file_name(text):
    """As tools/eval_command.cc names chart files: other characters than [A-Za-z0-9-_.] -> _."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in text)


RECORD_SUFFIXES = (".json", ".json.gz")


def record_stem(path):
    """NAME of NAME.json or NAME.json.gz."""
    name = os.path.basename(path)
    for suffix in sorted(RECORD_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return os.path.splitext(name)[0]


def record_paths(results_dir):
    """Every record of the folder (not of its subfolders), plain or gzipped."""
    return [p for suffix in RECORD_SUFFIXES for p in glob.glob(os.path.join(results_dir, "*" + suffix))]


class Record:
    def __init__(self, path):
        self.path = path
        self.stem = record_stem(path)
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
        self.settings = data.get("settings", {})
        self.configs = data.get("configs", [])
        self.cells = data.get("cells", [])
        self.summary = data.get("summary", [])
        self.samples = data.get("records", [])  # per sample: its output and score
        labels = [c["label"] for c in self.configs]
        # Tasks in the order the run names them, then any others the cells hold.
        self.tasks = list(self.settings.get("tasks", []))
        for cell in self.summary + self.cells:
            if cell["task"] not in self.tasks:
                self.tasks.append(cell["task"])
        self.tasks = [t for t in self.tasks if any(s["task"] == t for s in self.summary)]
        for cell in self.summary + self.cells:
            if cell["config"] not in labels:
                labels.append(cell["config"])
                self.configs.append({"label": cell["config"], "policy": cell["config"],
                                     "budget": None})
        self.labels = labels
        self.dense = next((c["label"] for c in self.configs
                           if c.get("policy") == "full" and c.get("budget") is None), None)

    def summary_of(self, task, label):
        return next((s for s in self.summary if s["task"] == task and s["config"] == label), None)

    def lengths(self):
        return sorted({c["length"] for c in self.cells if c.get("length")})

    def at_length(self, task, label, length):
        """The summary of one (task, configuration) at one prompt length: the mean score over
        that length's depths (each weighs the same), or its perplexity cell."""
        cells = [c for c in self.cells
                 if c["task"] == task and c["config"] == label and c.get("length") == length]
        if not cells:
            return None
        if task == PERPLEXITY or "perplexity" in cells[0]:
            return cells[0]
        return {"score": sum(c.get("score", 0.0) for c in cells) / len(cells),
                "samples": sum(c.get("samples", 0) for c in cells),
                "errors": sum(c.get("errors", 0) for c in cells)}

    def budgets(self):
        return sorted({c["budget"] for c in self.configs if c.get("budget") is not None})

    def policies(self):
        out = []
        for c in self.configs:
            if c.get("budget") is not None and c["policy"] not in out:
                out.append(c["policy"])
        return out


PRECISION_KEYS = ("quantization", "activation_dtype", "kv_cache_dtype")


def dtype_text(name):
    """A dtype as `sieve eval` records it (core/dtype.h's names) as the page says it."""
    return {"f8_e4m3": "FP8 e4m3"}.get(name, name)


def precision_label(settings):
    """What a record's weights and KV cache were held in, short: "f32", "fp8 weights",
    "fp8 weights + fp8 KV"; None for a record that does not say (older ones, remote runs)."""
    if not all(key in settings for key in PRECISION_KEYS):
        return None
    activations = settings["activation_dtype"]
    weights = "fp8 weights" if settings["quantization"] == "fp8" else None
    kv = None if settings["kv_cache_dtype"] == activations else (
        "fp8 KV" if settings["kv_cache_dtype"] == "f8_e4m3" else f"{settings['kv_cache_dtype']} KV")
    parts = [part for part in (weights, kv) if part]
    return " + ".join(parts) if parts else activations


def render_precision(settings):
    """The record's header line on weights, activations and KV cache; [] when it does not say."""
    if not all(key in settings for key in PRECISION_KEYS):
        return []
    quantization = settings["quantization"]
    weights = ("FP8 e4m3, a scale per output channel, each GEMM's input quantized per token"
               if quantization == "fp8" else f"unquantized ({settings['activation_dtype']})")
    kv = dtype_text(settings["kv_cache_dtype"])
    if settings["kv_cache_dtype"] == "f8_e4m3":
        kv += ", a scale per layer and KV head"
    return [f"- **Weights:** {weights} (`--quantization {quantization}`); **activations:** "
            f"{settings['activation_dtype']}; **KV cache:** {kv}"]


def render_settings(record):
    s = record.settings
    out = []
    model = s.get("model") or s.get("served_model_name") or "?"
    extra = []
    if s.get("max_model_len"):
        extra.append(f"max_model_len {s['max_model_len']}")
    if s.get("sieve_version"):
        extra.append(f"Sieve {s['sieve_version']}"
                     + (f" (commit `{s['sieve_commit']}`)" if s.get("sieve_commit") else ""))
    out.append(f"- **Model:** {model}" + (f"; {'; '.join(extra)}" if extra else ""))
    device = s.get("device") or (f"server at {s['base_url']}" if s.get("base_url") else "?")
    out.append(f"- **Device:** {device}")
    out += render_precision(s)
    needles = any(c.get("depth") is not None for c in record.cells)
    line = f"- **Tasks:** {', '.join(record.tasks) or '–'}"
    if s.get("lengths"):
        line += f"; **lengths:** {', '.join(fmt_number(x) for x in s['lengths'])} tokens"
    if s.get("depths") and needles:
        line += f"; **depths:** {', '.join(fmt_number(x) for x in s['depths'])}"
    out.append(line)
    line = f"- **Samples:** {s.get('samples', '?')} per cell; **seed:** {s.get('seed', '?')}"
    if s.get("haystack") and any(t not in (PERPLEXITY, "jsonl") for t in record.tasks):
        line += f"; **haystack:** `{s['haystack']}`"
    if s.get("window") is not None:
        line += f"; **KV window:** {s['window']}"
    options = s.get("kv_options") or {}
    knobs = [f"{k.replace('_', ' ')} {options[k]}" for k in ("sinks", "kernel", "beta",
                                                             "decode_cap") if k in options]
    if knobs:
        line += f" ({', '.join(knobs)})"
    out.append(line)
    if s.get("prompt_suffix"):
        out.append(f"- **Prompt suffix:** {json.dumps(s['prompt_suffix'])} appended to every "
                   "prompt (`--prompt-suffix`)")
    if s.get("text"):
        out.append(f"- **Perplexity text:** `{s['text']}`, {s.get('ppl_tokens', '?')} tokens "
                   "scored after each context")
    if s.get("data"):
        out.append(f"- **Data:** `{s['data']}`; metric {s.get('metric', '?')}; max tokens "
                   f"{s.get('max_tokens', '?')}; prompts truncated: {s.get('truncated', 0)}")
    if s.get("base_url"):
        out.append(f"- **Server:** {s['base_url']} (model name `{s.get('served_model_name', '')}`)")
    if s.get("command"):
        out.append(f"- **Command:** `{s['command']}`")
    return out


def kv_columns(record):
    """(header, {label: cells}) of the KV entries kept and the time, or None (a remote run)."""
    if not any(c.get("kv") for c in record.configs):
        return None
    preempt = any((c.get("kv") or {}).get("preemptions") for c in record.configs)
    header = ["KV kept", "time"] + (["preemptions"] if preempt else [])
    columns = {}
    for c in record.configs:
        kv = c.get("kv")
        if not kv:
            columns[c["label"]] = ["–"] * len(header)
            continue
        columns[c["label"]] = ([f"{100.0 * kv.get('kept_fraction', 1.0):.1f}%",
                                f"{kv.get('seconds', 0.0):.1f} s"]
                               + ([kv.get("preemptions", 0)] if preempt else []))
    return header, columns


KV_NOTE = ("KV kept: the KV entries kept after the prompts, all layers, as a share of dense; "
           "time: the configuration's whole run.")


def render_summary(record):
    names = [f"{task} (lower is better)" if task == PERPLEXITY else task for task in record.tasks]
    notes = []
    if any(task != PERPLEXITY for task in record.tasks):
        notes.append("Score: % of the expected values found in the greedy answer, averaged over "
                     "lengths and depths (each cell weighs the same).")
    if PERPLEXITY in record.tasks:
        notes.append("Perplexity: exp(mean NLL) over every scored token, lower is better.")
    columns = kv_columns(record)
    if columns:
        notes.append(KV_NOTE)
    out = ["### Summary", "", " ".join(notes), ""]
    if len(record.labels) <= TRANSPOSE_ABOVE:
        header = ["task", "samples"] + [f"`{label}`" for label in record.labels]
        rows = []
        for task, name in zip(record.tasks, names):
            first = record.summary_of(task, record.labels[0]) or {}
            rows.append([name, first.get("samples", "–")]
                        + [cell_text(record.summary_of(task, label)) for label in record.labels])
        if columns:
            for index, what in enumerate(columns[0]):
                rows.append([f"*{what}*", ""] + [columns[1][label][index]
                                                   for label in record.labels])
    else:  # many configurations: one row each, so the table stays narrow
        header = ["configuration"] + names + (columns[0] if columns else [])
        rows = [[f"`{label}`"] + [cell_text(record.summary_of(task, label))
                                  for task in record.tasks]
                + (columns[1][label] if columns else []) for label in record.labels]
    out += table(header, rows)
    for key, text in (("errors", "\\* requests that failed and were scored 0"),
                      ("truncated", "Prompts cut in the middle to fit")):
        counts = {}
        for item in record.summary:
            if item.get(key):
                counts[item["config"]] = counts.get(item["config"], 0) + item[key]
        if counts:
            out += ["", f"{text}: " + ", ".join(f"`{label}` {n}" for label, n in counts.items())
                    + "."]
    return out + [""]


def render_budgets(record):
    budgets = record.budgets()
    policies = record.policies()
    if len(budgets) < 2 or not policies:
        return []
    # At several lengths, the longest: a budget near or above a shorter prompt's length keeps
    # that prompt whole, which an average over lengths would mix in.
    lengths = record.lengths()
    longest = lengths[-1] if len(lengths) > 1 else None
    out = ["### Score against KV budget", "",
           "Budget: KV entries a sparse layer keeps (SnapKV C = B, PyramidKV average C = B, "
           "StreamingLLM sinks + recent = B, H2O heavy = recent = B / 2)"
           + (f"; `{record.dense}` is dense, the baseline." if record.dense else ".")
           + (f" At {longest} tokens, the longest prompts here (the summary above averages "
              "every length)." if longest else ""), ""]

    def summary(task, label):
        if label is None:
            return None
        return record.at_length(task, label, longest) if longest else record.summary_of(task, label)

    for task in record.tasks:
        unit = "perplexity, lower is better" if task == PERPLEXITY else "score %"
        header = ["policy"] + [str(b) for b in budgets]
        if record.dense:
            header.append(f"dense (`{record.dense}`)")
        rows = []
        dense_text = cell_text(summary(task, record.dense)) if record.dense else None
        for policy in policies:
            row = [f"`{policy}`"]
            for budget in budgets:
                label = next((c["label"] for c in record.configs
                              if c["policy"] == policy and c.get("budget") == budget), None)
                row.append(cell_text(summary(task, label)) if label else "–")
            if record.dense:
                row.append(dense_text)
            rows.append(row)
        where = f", {longest} tokens" if longest else ""
        out += [f"**{task}** ({unit}{where})", ""] + table(header, rows) + [""]
    return out


def render_dense_grid(record):
    if not record.dense:
        return []
    lengths = sorted({c["length"] for c in record.cells if c.get("length")})
    if not lengths:
        return []
    rows = []
    needles = any(c.get("depth") is not None for c in record.cells)
    for task in record.tasks:
        cells = [c for c in record.cells if c["task"] == task and c["config"] == record.dense]
        depths = sorted({c.get("depth") for c in cells}, key=lambda d: (d is not None, d or 0.0))
        for index, depth in enumerate(depths):
            row = [task if index == 0 else ""]
            if needles:
                row.append("–" if depth is None else fmt_number(depth))
            for length in lengths:
                cell = next((c for c in cells
                             if c.get("length") == length and c.get("depth") == depth), None)
                row.append(cell_text(cell))
            rows.append(row)
    if not rows:
        return []
    header = ["task"] + (["depth"] if needles else []) + [str(length) for length in lengths]
    units = []
    if any(task != PERPLEXITY for task in record.tasks):
        units.append("score %")
    if PERPLEXITY in record.tasks:
        units.append("perplexity for the perplexity task" if units else
                     "perplexity, lower is better")
    title = f"### Dense (`{record.dense}`) by prompt length (tokens)"
    note = "; ".join(units).capitalize() + "."
    if needles:
        title += " and needle depth"
        if any(c.get("depth") is None for c in record.cells):
            note += " Depth –: the task has no needle depth."
    return [title, "", note, ""] + table(header, rows) + [""]


def render_charts(record, plots_dir, link_prefix):
    folder = os.path.join(plots_dir, record.stem)
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "*.svg")))
    if not files:
        return []

    def link(name):
        return f"{link_prefix}/{record.stem}/{name}"

    used = set()
    out = ["### Charts", ""]
    budget = [f"budget_{task}.svg" for task in record.tasks if f"budget_{task}.svg" in files]
    if budget:
        out += [" ".join(f"![{name[len('budget_'):-4]}: score vs KV budget]({link(name)})"
                         for name in budget), ""]
        used.update(budget)
    # needle_<task>_<sanitized label>.svg: a heatmap of score by length and depth.
    heatmaps = {}
    for task in record.tasks:
        for label in record.labels:
            name = f"needle_{task}_{sanitize_file_name(label)}.svg"
            if name in files:
                heatmaps.setdefault(task, []).append((label, name))
    dense = [(task, name) for task, items in heatmaps.items()
             for label, name in items if label == record.dense]
    if dense:
        out += [f"Needle heatmaps, dense (`{record.dense}`): score by prompt length and depth.", "",
                " ".join(f"![{task}: {record.dense}]({link(name)})" for task, name in dense), ""]
        used.update(name for _, name in dense)
    rows = []
    for task, items in heatmaps.items():
        others = [(label, name) for label, name in items if label != record.dense]
        if others:
            rows.append([task, " · ".join(f"[{label}]({link(name)})" for label, name in others)])
            used.update(name for _, name in others)
    if rows:
        out += ["Needle heatmaps of the other configurations:", ""]
        out += table(["task", "configuration"], rows, ["l", "l"]) + [""]
    rest = [name for name in files if name not in used]
    if rest:
        out += ["Other charts: " + " · ".join(f"[{name}]({link(name)})" for name in rest), ""]
    return out


# Settings that may differ between records compared as precisions of one run: the command line
# and the model's description (both name the precision), and the build.
NOT_THE_RUN = ("command", "model", "sieve_version", "sieve_commit") + PRECISION_KEYS
SCORE_TARGET_POINTS = 1.0  # issue 58: FP8 within 1 point of the baseline on each task
PERPLEXITY_TARGET = 0.02  # and within 2% on perplexity


def precision_groups(records):
    """{baseline stem: [baseline, others...]}: records of the same run (model, device, tasks,
    grid, samples, seed, policies, ...) at other weight or KV cache precisions, compared in the
    section of the one whose weights and KV cache are the activation dtype's (the baseline)."""
    groups = {}
    for record in records:
        if precision_label(record.settings) is None:
            continue
        key = json.dumps({k: v for k, v in record.settings.items() if k not in NOT_THE_RUN},
                         sort_keys=True)
        groups.setdefault(key, []).append(record)
    out = {}
    for members in groups.values():
        labels = [precision_label(r.settings) for r in members]
        baseline = next((r for r in members if r.settings["quantization"] == "none"
                         and r.settings["kv_cache_dtype"] == r.settings["activation_dtype"]), None)
        if baseline is None or len(set(labels)) < 2:
            continue
        # Weights first, then KV cache: f32, fp8 KV, fp8 weights, fp8 weights + fp8 KV.
        out[baseline.stem] = sorted(members, key=lambda r: (
            r.settings["quantization"] != "none",
            r.settings["kv_cache_dtype"] != r.settings["activation_dtype"], r.stem))
    return out


def delta_text(task, value, base):
    """The difference from the baseline: points of score, or perplexity's relative change; bold
    where it misses issue 58's target for FP8."""
    if task == PERPLEXITY:
        change = value["perplexity"] / base["perplexity"] - 1.0
        text, missed = f"{100.0 * change:+.1f}%", abs(change) > PERPLEXITY_TARGET
    else:
        change = 100.0 * (value.get("score", 0.0) - base.get("score", 0.0))
        text, missed = f"{change:+.1f}", abs(change) > SCORE_TARGET_POINTS + 1e-9
    return f"**{text}**" if missed else text


def changed_answers(record, baseline, task, label):
    """"changed/total": the samples of (task, configuration) whose greedy answer differs from the
    baseline's on the same sample; "–" where the records hold no answers (perplexity)."""
    def answers(r):
        return {(s.get("length"), s.get("depth"), s.get("index")): s.get("output")
                for s in r.samples if s.get("task") == task and s.get("config") == label
                and "output" in s}
    base, other = answers(baseline), answers(record)
    if not base:
        return "–"
    changed = sum(1 for key, output in base.items() if other.get(key) != output)
    return f"{changed}/{len(base)}"


def render_precisions(group):
    """One table of every (task, configuration) at each precision of the group, with the
    difference from the baseline (the first) and the answers that changed."""
    baseline = group[0]
    names = [precision_label(r.settings) for r in group]
    labels = [label for label in baseline.labels if all(label in r.labels for r in group[1:])]
    header = (["task", "configuration"] + [f"{name}" for name in names]
              + [f"Δ {name}" for name in names[1:]]
              + [f"answers changed, {name}" for name in names[1:]])
    rows = []
    for task in baseline.tasks:
        for index, label in enumerate(labels):
            values = [r.summary_of(task, label) for r in group]
            row = [(f"{task} (lower is better)" if task == PERPLEXITY else task)
                   if index == 0 else "", f"`{label}`"] + [cell_text(v) for v in values]
            for value in values[1:]:
                ok = value and value.get("samples") and values[0] and values[0].get("samples")
                row.append(delta_text(task, value, values[0]) if ok else "–")
            row += [changed_answers(r, baseline, task, label) for r in group[1:]]
            rows.append(row)
    sources = ", ".join(f"{name}: [{r.stem}](#{r.stem})" for name, r in zip(names, group))
    return (["### Against other weight and KV cache precisions", "",
             f"The same samples at each precision ({sources}). Scores in %, averaged over lengths "
             "and depths as in the summary; Δ: the difference from "
             f"{names[0]}, in points of score or as perplexity's relative change, in bold where "
             f"it is more than issue 58's target for FP8 ({SCORE_TARGET_POINTS:g} point on a "
             f"task, {100 * PERPLEXITY_TARGET:g}% on perplexity); answers changed: the samples "
             f"whose greedy answer is not {names[0]}'s, of those in the row.", ""]
            + table(header, rows) + [""])


TWO_TURN = "niah-two-turn"
# Settings that may differ between records compared as ways of running a two-turn task's second
# turn (`--second-turn`, prefix caching on or off): the command line and the build.
NOT_THE_CONVERSATION = ("command", "second_turn", "sieve_version", "sieve_commit")


def turn_mode(record):
    """How a two-turn record ran turn 2: "reuse", "prefill, cache on" or "prefill, cache off"
    (the record's own prefix-cache lookups tell: a run with the cache off looks nothing up)."""
    mode = record.settings.get("second_turn")
    if mode != "prefill":
        return mode
    looked_up = sum(turn.get("prefix_cache_queries", 0) for c in record.configs
                    for turn in (c.get("kv") or {}).get("turns", []))
    return "prefill, cache on" if looked_up > 0 else "prefill, cache off"


def turn_groups(records):
    """{stem of the prefill + cache-on record: [it, others...]}: two-turn records of the same run
    with turn 2 run another way, compared in the first's section."""
    groups = {}
    for record in records:
        if TWO_TURN not in record.tasks or record.settings.get("second_turn") is None:
            continue
        key = json.dumps({k: v for k, v in record.settings.items()
                          if k not in NOT_THE_CONVERSATION}, sort_keys=True)
        groups.setdefault(key, []).append(record)
    order = ["prefill, cache on", "prefill, cache off", "reuse"]
    out = {}
    for members in groups.values():
        members = sorted(members, key=lambda r: (order.index(turn_mode(r))
                                                 if turn_mode(r) in order else len(order), r.stem))
        if len(members) > 1 and turn_mode(members[0]) == order[0]:
            out[members[0].stem] = members
    return out


def first_turn_score(record, label):
    """Turn 1's score of one configuration: the mean of its cells' means, as the summary's."""
    cells = {}
    for sample in record.samples:
        if sample.get("task") == TWO_TURN and sample.get("config") == label \
                and "first_turn_score" in sample:
            cells.setdefault((sample.get("length"), sample.get("depth")), []).append(
                sample["first_turn_score"])
    if not cells:
        return None
    return sum(sum(v) / len(v) for v in cells.values()) / len(cells)


def render_turns(group):
    """One table: each configuration's turn-1 score, then turn 2's score and time in each way of
    running it."""
    modes = [turn_mode(r) for r in group]
    labels = [label for label in group[0].labels if all(label in r.labels for r in group[1:])]
    header = (["configuration", "turn 1"] + [f"turn 2, {mode}" for mode in modes]
              + [f"turn 2 time, {mode}" for mode in modes])
    rows = []
    for label in labels:
        first = first_turn_score(group[0], label)
        row = [f"`{label}`", pct(first) if first is not None else "–"]
        row += [cell_text(r.summary_of(TWO_TURN, label)) for r in group]
        for r in group:
            kv = next((c.get("kv") for c in r.configs if c["label"] == label), None) or {}
            turns = kv.get("turns", [])
            row.append(f"{turns[1]['seconds']:.1f} s" if len(turns) > 1 else "–")
        rows.append(row)
    sources = ", ".join(f"{mode}: [{r.stem}](#{r.stem})" for mode, r in zip(modes, group))
    return (["### Turn 2: prefilled or on turn 1's compressed cache", "",
             f"The same conversations with turn 2 run each way ({sources}). Scores in %, "
             "averaged over lengths and depths as in the summary (turn 2's needle at the depth); "
             "turn 1 is the same in every record. *prefill*: turn 2 as a new request over the "
             "whole conversation, compressed under its own question (cache on: turn 1's prompt "
             "pages found in the prefix cache; off: the context prefilled again); *reuse*: turn 2 "
             "on the cache turn 1's policy left, compressed under turn 1's question (its answer "
             "and the new question as decode steps). Time: the configuration's turn 2, all its "
             "samples at once.", ""]
            + table(header, rows) + [""])


def render_record(record, plots_dir, link_prefix, precisions=None, turns=None):
    out = [f"## {record.stem}", ""]
    out += render_settings(record) + [""]
    sidecar = os.path.join(os.path.dirname(record.path), record.stem + ".md")
    if os.path.exists(sidecar):
        with open(sidecar, encoding="utf-8") as f:
            notes = f.read().strip("\n")
        if notes:
            out += [notes, ""]
    out += render_summary(record)
    if precisions:
        out += render_precisions(precisions)
    if turns:
        out += render_turns(turns)
    out += render_budgets(record)
    out += render_dense_grid(record)
    out += render_charts(record, plots_dir, link_prefix)
    return out


INTRO = [
    "<!-- Generated by scripts/render_accuracy.py from bench/results/accuracy/*.json(.gz); "
    "do not edit by hand. -->",
    "# Accuracy of KV policies",
    "",
    "How much long-context accuracy each KV-cache policy keeps at each budget, measured with "
    "`sieve eval`: dense (`full`) first as the baseline, then every `--kv-policy` x `--kv-budget` "
    "on the same samples. A sample is a synthetic RULER-style prompt (passkey, needles in a "
    "haystack, key-value retrieval, variable tracking, common words) built to a target length "
    "with a needle at a given depth; its score is the share of expected values found in the "
    "greedy answer. Perplexity forces held-out text through decode steps, so the compressed "
    "cache is what predicts it. To reproduce a record, run the command given in its section "
    "with "
    "`--result-json bench/results/accuracy/NAME.json --plot-dir PLOTS`, then "
    "`python3 scripts/render_accuracy.py --copy-plots NAME=PLOTS`. Records of one grid at "
    "several weight and KV cache precisions (`--quantization`, `--kv-cache-dtype`) are compared "
    "cell for cell in the unquantized record's section. How samples are built and "
    "scored: [tools/eval/README.md](../tools/eval/README.md). This page is generated from the "
    "records by `scripts/render_accuracy.py`.",
    "",
]


def ordered_records(results_dir):
    """The records' paths: page_order.txt's stems first, in its order, then newest name first."""
    paths = sorted(record_paths(results_dir), key=record_stem, reverse=True)
    order_path = os.path.join(results_dir, "page_order.txt")
    order = []
    if os.path.exists(order_path):
        with open(order_path, encoding="utf-8") as f:
            order = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    stem = record_stem
    duplicated = sorted({stem(p) for p in paths if [stem(q) for q in paths].count(stem(p)) > 1})
    if duplicated:
        sys.exit(f"error: records both plain and gzipped: {', '.join(duplicated)}")
    missing = [name for name in order if name not in {stem(p) for p in paths}]
    if missing:
        sys.exit(f"error: page_order.txt names records that do not exist: {', '.join(missing)}")
    rank = {name: index for index, name in enumerate(order)}
    return sorted(paths, key=lambda p: rank.get(stem(p), len(order)))


def render(results_dir, plots_dir, out_path):
    link_prefix = os.path.relpath(plots_dir, os.path.dirname(os.path.abspath(out_path)))
    link_prefix = link_prefix.replace(os.sep, "/")
    lines = list(INTRO)
    paths = ordered_records(results_dir)
    if not paths:
        lines += ["No records yet.", ""]
    records = [Record(path) for path in paths]
    if len(records) > 1:
        lines += ["Records on this page:", ""]
        lines += [f"- [{r.stem}](#{r.stem})" for r in records] + [""]
    groups = precision_groups(records)
    conversations = turn_groups(records)
    for record in records:
        lines += render_record(record, plots_dir, link_prefix, groups.get(record.stem),
                               conversations.get(record.stem))
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def copy_plots(specs, results_dir, plots_dir):
    for spec in specs:
        stem, sep, source = spec.partition("=")
        if not sep or not stem or not source:
            sys.exit(f"error: --copy-plots takes RECORD_STEM=PLOT_DIR, not {spec!r}")
        if not any(os.path.exists(os.path.join(results_dir, stem + suffix))
                   for suffix in RECORD_SUFFIXES):
            sys.exit(f"error: --copy-plots {stem}: no record {stem}.json(.gz) in {results_dir}")
        charts = sorted(glob.glob(os.path.join(source, "*.svg")))
        if not charts:
            sys.exit(f"error: --copy-plots {stem}: no .svg files in {source}")
        dest = os.path.join(plots_dir, stem)
        os.makedirs(dest, exist_ok=True)
        for old in glob.glob(os.path.join(dest, "*.svg")):
            os.remove(old)
        for chart in charts:
            shutil.copyfile(chart, os.path.join(dest, os.path.basename(chart)))
        shown = os.path.relpath(dest)
        print(f"copied {len(charts)} charts to {dest if shown.startswith('..') else shown}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-dir",
                        default=os.path.join(ROOT, "bench", "results", "accuracy"),
                        help="the records, *.json (default: bench/results/accuracy)")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "accuracy.md"),
                        help="the page (default: docs/accuracy.md)")
    parser.add_argument("--plots-dir",
                        help="charts, one folder per record (default: the page's path without "
                        ".md, i.e. docs/accuracy)")
    parser.add_argument("--copy-plots", action="append", default=[], metavar="STEM=PLOT_DIR",
                        help="copy a `sieve eval --plot-dir` folder's charts to PLOTS_DIR/STEM "
                        "(replacing the .svg files there) before rendering; repeatable")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the page is not what would be written")
    args = parser.parse_args()
    plots_dir = args.plots_dir or os.path.splitext(args.out)[0]
    if args.check and args.copy_plots:
        parser.error("--check writes nothing: drop --copy-plots")
    if args.copy_plots:
        copy_plots(args.copy_plots, args.results_dir, plots_dir)
    text = render(args.results_dir, plots_dir, args.out)
    if args.check:
        try:
            with open(args.out, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = ""
        if current != text:
            diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(),
                                             args.out, "rendered", lineterm=""))
            print("\n".join(diff[:60]))
            print(f"{args.out} is stale: run python3 scripts/render_accuracy.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
