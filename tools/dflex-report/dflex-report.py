#!/usr/bin/env python3
"""dflex-report: plots and TensorBoard scalars from a run's metrics.jsonl
(docs/train.md, "Run report")."""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

NUMBER_KEYS = ("step", "epoch", "time", "loss", "tau", "lr", "grad_norm", "tokens_per_s")
# Scalars that mean nothing on an update skipped for non-finite values.
MODEL_KEYS = ("loss", "tau", "grad_norm")


def fail(code, message):
    print(f"dflex-report: {message}", file=sys.stderr)
    sys.exit(code)


def is_number(value):
    # null stands for a non-finite value written by a strict JSON writer.
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def number(value):
    return math.nan if value is None else float(value)


def check_record(rec, previous):
    if not isinstance(rec, dict):
        return "expected a JSON object"
    for key in NUMBER_KEYS + ("accuracy", "skipped", "times_ms", "peak_memory_bytes"):
        if key not in rec:
            return f"missing key '{key}'"
    if not isinstance(rec["step"], int) or isinstance(rec["step"], bool):
        return "'step' is not an integer"
    for key in NUMBER_KEYS:
        if not is_number(rec[key]):
            return f"'{key}' is not a number"
    if not isinstance(rec["skipped"], bool):
        return "'skipped' is not true or false"
    if not isinstance(rec["accuracy"], list) or not all(map(is_number, rec["accuracy"])):
        return "'accuracy' is not a list of numbers"
    for key in ("times_ms", "peak_memory_bytes"):
        if not isinstance(rec[key], dict) or not all(map(is_number, rec[key].values())):
            return f"'{key}' is not an object of numbers"
    if previous is not None:
        if rec["step"] <= previous["step"]:
            return f"step {rec['step']} does not follow step {previous['step']}"
        if len(rec["accuracy"]) != len(previous["accuracy"]):
            return (f"{len(rec['accuracy'])} accuracy entries, "
                    f"the line before has {len(previous['accuracy'])}")
    return None


def read_metrics(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        fail(2, f"{path}: {e.strerror}")
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            # The trainer may be writing this line right now; it is complete on the next run.
            if lineno == len(lines) and not line.endswith("\n"):
                break
            fail(2, f"{path}:{lineno}: not valid JSON: {e.msg} (column {e.colno})")
        problem = check_record(rec, records[-1] if records else None)
        if problem:
            fail(2, f"{path}:{lineno}: {problem}")
        records.append(rec)
    if not records:
        fail(2, f"{path}: no logged steps yet")
    return records


def save(fig, directory, name, formats):
    for fmt in formats:
        # Not mkstemp: its 0600 would make the plots private; open() follows the umask.
        tmp = os.path.join(directory, f".{name}.{fmt}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                fig.savefig(f, format=fmt)
            os.replace(tmp, os.path.join(directory, f"{name}.{fmt}"))
        except BaseException:
            os.unlink(tmp)
            raise


def curve(ax, x, y, **kwargs):
    # A lone point draws no line; the first report of a run has one step.
    ax.plot(x, y, marker="o" if len(x) == 1 else "", **kwargs)


def plot(records, directory, formats):
    from matplotlib.figure import Figure
    # A log of nothing but skipped updates still gets its plots.
    ok = [r for r in records if not r["skipped"]] or records
    steps = [r["step"] for r in records]
    ok_steps = [r["step"] for r in ok]
    num_k = len(records[0]["accuracy"])

    def figure(title, ncols=1):
        fig = Figure(figsize=(6.4 * ncols, 4.8), layout="constrained")
        axes = fig.subplots(1, ncols, squeeze=False)[0]
        fig.suptitle(title)
        return fig, axes

    for key, title, label in (("loss", "training loss", "loss"),
                              ("tau", "estimated acceptance length", "τ (tokens per block)")):
        fig, (ax,) = figure(title)
        curve(ax, ok_steps, [number(r[key]) for r in ok])
        ax.set(xlabel="step", ylabel=label)
        save(fig, directory, key, formats)

    fig, (last, over) = figure("accuracy by block position k", ncols=2)
    ks = list(range(1, num_k + 1))
    last.bar(ks, [number(a) for a in ok[-1]["accuracy"]])
    last.set(xlabel="block position k", ylabel="accuracy", xticks=ks,
             title=f"step {ok[-1]['step']}")
    for k in ks:
        curve(over, ok_steps, [number(r["accuracy"][k - 1]) for r in ok], label=f"k={k}")
    over.set(xlabel="step", ylabel="accuracy", title="over steps")
    over.legend(ncol=max(1, num_k // 8))
    save(fig, directory, "accuracy", formats)

    fig, (tps, parts_ax) = figure("throughput", ncols=2)
    curve(tps, steps, [number(r["tokens_per_s"]) for r in records])
    tps.set(xlabel="step", ylabel="tokens/s", title="tokens per second")
    # Keys in first-seen order, so the stack keeps the trainer's order of the phases.
    parts = list(dict.fromkeys(k for r in records for k in r["times_ms"]))
    parts_ax.stackplot(steps, *[[number(r["times_ms"].get(p, 0)) for r in records] for p in parts],
                       labels=parts)
    parts_ax.set(xlabel="step", ylabel="time (ms)", title="step time by phase")
    parts_ax.legend(loc="upper left", fontsize="small")
    save(fig, directory, "throughput", formats)


def scalars(rec):
    values = {"train/lr": rec["lr"], "train/tokens_per_s": rec["tokens_per_s"]}
    if not rec["skipped"]:
        values.update({f"train/{key}": rec[key] for key in MODEL_KEYS})
        values.update({f"train/accuracy_k{k}": a for k, a in enumerate(rec["accuracy"], 1)})
    values.update({f"time/{part}_ms": t for part, t in rec["times_ms"].items()})
    values.update({f"memory/{dev.replace(':', '_')}_peak_bytes": b
                   for dev, b in rec["peak_memory_bytes"].items()})
    return values


def write_tensorboard(records, log_dir):
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    board = os.path.join(log_dir, "tensorboard")
    os.makedirs(board, exist_ok=True)
    # A resume may have truncated the log, so the events are rewritten whole; the partial file
    # lives outside tensorboard/ until complete, so TensorBoard never reads half of it.
    tmp = tempfile.mkdtemp(prefix=".tensorboard.", dir=log_dir)
    try:
        writer = EventFileWriter(tmp)
        for rec in records:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=number(v))
                                     for tag, v in scalars(rec).items()])
            writer.add_event(Event(step=rec["step"], wall_time=number(rec["time"]),
                                   summary=summary))
        writer.close()
        (name,) = os.listdir(tmp)
        stale = [f for f in os.listdir(board)
                 if f.startswith("events.out.tfevents.") and f != name]
        os.replace(os.path.join(tmp, name), os.path.join(board, name))
        for f in stale:
            os.unlink(os.path.join(board, f))
    finally:
        shutil.rmtree(tmp)


def main():
    parser = argparse.ArgumentParser(prog="dflex-report", description=__doc__)
    parser.add_argument("log_dir", metavar="LOG_DIR")
    parser.add_argument("--metrics", metavar="FILE", help="default: LOG_DIR/metrics.jsonl")
    parser.add_argument("--formats", default="png,svg", help="plot formats (default: png,svg)")
    args = parser.parse_args()
    records = read_metrics(args.metrics or os.path.join(args.log_dir, "metrics.jsonl"))
    for module in ("matplotlib", "tensorboard"):
        try:
            __import__(module)
        except ModuleNotFoundError as e:
            fail(3, f"missing Python module '{e.name}': {sys.executable} -m pip install {module}")
    import matplotlib
    matplotlib.use("Agg")  # training machines have no display
    # Text stays text in SVGs: searchable, and smaller than glyph paths.
    matplotlib.rcParams["svg.fonttype"] = "none"
    from matplotlib.figure import Figure
    formats = [f for f in args.formats.split(",") if f]
    supported = Figure().canvas.get_supported_filetypes()
    for fmt in formats:
        if fmt not in supported:
            fail(2, f"--formats: unknown format '{fmt}' "
                    f"(supported: {', '.join(sorted(supported))})")
    plots = os.path.join(args.log_dir, "plots")
    os.makedirs(plots, exist_ok=True)
    plot(records, plots, formats)
    write_tensorboard(records, args.log_dir)
    print(f"dflex-report: {len(records)} steps (last {records[-1]['step']}) -> {plots}, "
          f"{os.path.join(args.log_dir, 'tensorboard')}")


if __name__ == "__main__":
    main()
