#!/usr/bin/env python3
"""Charts of llmt's results, as PNG files (matplotlib; never needed by the trainer).

  pip install -r scripts/requirements-plot.txt

  scripts/plot.py bench RESULTS.jsonl [--out DIR]
      llmt bench --results lines: tokens/s and MFU against the per-device batch and against the
      sequence length, one line per (model, fsdp, precision, other axis), each point with error
      bars from the step time's p10 and p90 (step_ms_p10 / step_ms_p90: the spread over the
      timed steps; tokens/s and MFU scale as 1 / step time); out-of-memory points are marked with
      an x on the axis. Writes DIR/bench_batch.png and DIR/bench_seq_len.png, and says how many
      points carry error bars in each.

  scripts/plot.py run OUTPUT_DIR|metrics.jsonl [--out FILE.png]
      a training run: loss (eval loss as points), learning rate, gradient norm and tokens/s
      against the step, with the run's checkpoints (OUTPUT_DIR/checkpoint-N) as dotted lines; for a
      run of several ranks, a third row: each rank's compute and collective-wait time per step (the
      slow-rank report's figures, compute_ms_per_rank and comm_wait_ms_per_rank), the ranks it named
      marked. Default FILE: OUTPUT_DIR/curves.png.
"""
import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.container  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot.py: {path} line {n}: not JSON ({e})")
    return rows


def series_label(row, varying):
    parts = [row.get("model", "?"), row.get("fsdp") or "no_shard", "bf16" if row.get("bf16") else "fp32"]
    if row.get("gradient_checkpointing"):
        parts.append("ckpt")
    parts += [f"{k}={row.get(k)}" for k in varying]
    return ", ".join(str(p) for p in parts)


def spread(rows, value):
    """Error bars for value (tokens/s or MFU, both proportional to 1 / step time) from the step
    time's p10 and p90: [below, above] per row, 0 where a row has no spread recorded."""
    below, above = [], []
    for r in rows:
        med, p10, p90 = r.get("step_ms_median"), r.get("step_ms_p10"), r.get("step_ms_p90")
        if med and p10 and p90:
            v = value(r)
            below.append(v - v * med / p90)  # the slow steps (p90) give the low rate
            above.append(v * med / p10 - v)
        else:
            below.append(0.0)
            above.append(0.0)
    return [below, above]


def error_bars_drawn(ax):
    """How many points of ax carry a drawn error bar of nonzero length (read back from the figure)."""
    n = 0
    for c in ax.containers:
        if isinstance(c, matplotlib.container.ErrorbarContainer):
            for lc in c.lines[2]:
                n += sum(1 for seg in lc.get_segments() if abs(seg[1][1] - seg[0][1]) > 0)
    return n


def plot_bench(path, out_dir):
    rows = read_jsonl(path)
    if not rows:
        sys.exit(f"plot.py: {path} holds no results")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for axis, other in (("batch", "seq_len"), ("seq_len", "batch")):
        groups = {}
        for r in rows:
            key = series_label(r, [other])
            groups.setdefault(key, []).append(r)
        fig, (ax_tps, ax_mfu) = plt.subplots(1, 2, figsize=(12, 4.5))
        for label, rs in sorted(groups.items()):
            rs = sorted(rs, key=lambda r: r[axis])
            ok = [r for r in rs if not r.get("oom")]
            bad = [r for r in rs if r.get("oom")]
            if ok:
                tps = ax_tps.errorbar([r[axis] for r in ok], [r["tokens_per_s"] for r in ok],
                                      yerr=spread(ok, lambda r: r["tokens_per_s"]), fmt="o-", capsize=3, label=label)
                with_mfu = [r for r in ok if r.get("mfu") is not None]
                if with_mfu:
                    ax_mfu.errorbar([r[axis] for r in with_mfu], [100 * r["mfu"] for r in with_mfu],
                                    yerr=spread(with_mfu, lambda r: 100 * r["mfu"]), fmt="o-", capsize=3,
                                    color=tps.lines[0].get_color(), label=label)
            if bad:
                ax_tps.plot([r[axis] for r in bad], [0] * len(bad), "x", color="red", markersize=9,
                            label=f"{label}: out of memory")
        for ax, name in ((ax_tps, "tokens/s (all ranks)"), (ax_mfu, "MFU (%)")):
            ax.set_xlabel("per-device batch" if axis == "batch" else "sequence length")
            ax.set_ylabel(name)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r[axis] for r in rows}))
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.grid(alpha=0.3)
        ax_tps.legend(fontsize=7)
        m = rows[0].get("machine", {})
        peak = "GPU peak" if rows[0].get("device") == "cuda" else "measured matmul peak"
        fig.suptitle(f"llmt bench on {m.get('host', '?')} ({m.get('cpu', '?')}), {rows[0].get('ranks', '?')} rank(s), "
                     f"commit {m.get('commit', '?')}; MFU against the {peak}; bars: p10-p90 of the step time",
                     fontsize=9)
        fig.tight_layout()
        target = os.path.join(out_dir, f"bench_{axis}.png")
        print(f"plot.py: {os.path.basename(target)}: error bars on {error_bars_drawn(ax_tps)} tokens/s and "
              f"{error_bars_drawn(ax_mfu)} MFU points of {sum(1 for r in rows if not r.get('oom'))}")
        fig.savefig(target, dpi=110)
        plt.close(fig)
        written.append(target)
    return written


def plot_ranks(axes, rows):
    """Each rank's compute and collective-wait ms per step over each logging window; a rank the
    slow-rank report named is marked with a red x on its compute line."""
    steps = [r["step"] for r in rows]
    ranks = len(rows[0]["compute_ms_per_rank"])
    for ax, key, name in ((axes[0], "compute_ms_per_rank", "compute ms/step per rank"),
                          (axes[1], "comm_wait_ms_per_rank", "collective wait ms/step per rank")):
        for rank in range(ranks):
            ax.plot(steps, [r[key][rank] if rank < len(r[key]) else None for r in rows], "-", linewidth=1.0,
                    label=f"rank {rank}" if ranks <= 8 else None)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    named = [(r["step"], r["compute_ms_per_rank"][k]) for r in rows for k in r.get("slow_ranks", [])]
    if named:
        axes[0].plot([s for s, _ in named], [v for _, v in named], "x", color="tab:red", label="named slow")
    if ranks <= 8 or named:
        axes[0].legend(fontsize=8)
    print(f"plot.py: per-rank times of {ranks} ranks at {len(rows)} steps, {len(named)} slow-rank marks")


def plot_run(path, out, title=None):
    metrics = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(metrics):
        sys.exit(f"plot.py: no {metrics} (give a run's output_dir or its metrics.jsonl)")
    run_dir = os.path.dirname(os.path.abspath(metrics))
    rows = read_jsonl(metrics)
    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval_loss" in r]
    if not train:
        sys.exit(f"plot.py: {metrics} holds no training records")
    checkpoints = sorted(int(m.group(1)) for d in os.listdir(run_dir)
                         if (m := re.fullmatch(r"checkpoint-(\d+)", d)) and os.path.isdir(os.path.join(run_dir, d)))
    ranked = [r for r in train if "compute_ms_per_rank" in r]
    fig, axes = plt.subplots(3 if ranked else 2, 2, figsize=(11, 10.5 if ranked else 7), sharex=True)
    steps = [r["step"] for r in train]
    panels = ((axes[0][0], "loss", "loss"), (axes[0][1], "learning_rate", "learning rate"),
              (axes[1][0], "grad_norm", "gradient norm"), (axes[1][1], "tokens_per_s", "tokens/s"))
    for ax, key, name in panels:
        ax.plot(steps, [r.get(key) for r in train], "-", linewidth=1.2, label=f"train {name}")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        for c in checkpoints:
            ax.axvline(c, linestyle=":", color="gray", linewidth=0.8)
    if evals:
        axes[0][0].plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o", color="tab:red",
                        label="eval loss")
    axes[0][0].legend(fontsize=8)
    if ranked:
        plot_ranks(axes[2], ranked)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    note = f"; checkpoints at {', '.join(map(str, checkpoints))}" if checkpoints else ""
    # the run's name, never the machine's absolute path (a chart travels to READMEs and papers)
    fig.suptitle(f"{title or os.path.basename(run_dir)}{note}", fontsize=9)
    print(f"plot.py: title: {title or os.path.basename(run_dir)}{note}")
    fig.tight_layout()
    target = out or os.path.join(run_dir, "curves.png")
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return [target]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bench", help="llmt bench --results lines")
    b.add_argument("results")
    b.add_argument("--out", default=".")
    r = sub.add_parser("run", help="a training run's metrics.jsonl")
    r.add_argument("path")
    r.add_argument("--out", default=None)
    r.add_argument("--title", default=None, help="the chart's title (default: the run directory's name)")
    a = p.parse_args()
    written = plot_bench(a.results, a.out) if a.what == "bench" else plot_run(a.path, a.out, a.title)
    for w in written:
        print(f"plot.py: wrote {w}")


if __name__ == "__main__":
    main()
