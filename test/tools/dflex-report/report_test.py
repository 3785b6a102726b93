#!/usr/bin/env python3
"""dflex-report draws readable plots and TensorBoard scalars equal to the log, rewrites the
events after the log was truncated by a resume, and names the file and line of a bad line."""
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import matplotlib.image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

report = sys.argv[1]
K = 4
SKIPPED = 12
PLOTS = {"loss": "loss", "accuracy": "block position k", "tau": "step",
         "throughput": "tokens/s"}


def record(i):
    skipped = i == SKIPPED
    return {"step": 10 * (i + 1), "epoch": i // 20, "time": 1733100000.5 + 3.25 * i,
            "loss": math.nan if skipped else 3.0 / (1 + 0.1 * i) + 0.01 * math.sin(i),
            "accuracy": [0.3 + 0.5 * (1 - 1 / (1 + i)) / k for k in range(1, K)],
            "tau": 1 + 0.05 * i, "lr": 6e-4 * min(1, (i + 1) / 5), "grad_norm": 0.8 + 0.01 * i,
            "tokens_per_s": 12000.0 + 37 * i, "skipped": skipped,
            "times_ms": {"data": 1.0, "target_forward": 3.0 + i % 3, "transfer": 0.1,
                         "drafter_forward": 4.0, "backward": 8.0 + i % 2, "optimizer": 0.5},
            "peak_memory_bytes": {"cpu": 0, "cuda:0": 123456789 + i}}


def run(log_dir, *args):
    return subprocess.run([sys.executable, report, log_dir, *args], capture_output=True, text=True)


def write_log(path, records, tail=""):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.write(tail)


def check_tensorboard(log_dir, records):
    files = glob.glob(os.path.join(log_dir, "tensorboard", "events.out.tfevents.*"))
    assert len(files) == 1, files
    acc = EventAccumulator(os.path.join(log_dir, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {"train/loss", "train/tau", "train/lr", "train/grad_norm", "train/tokens_per_s",
                "memory/cpu_peak_bytes", "memory/cuda_0_peak_bytes"}
    expected |= {f"train/accuracy_k{k}" for k in range(1, K)}
    expected |= {f"time/{part}_ms" for part in records[0]["times_ms"]}
    assert tags == expected, tags ^ expected
    trained = [r for r in records if not r["skipped"]]
    for tag, rows, value in (("train/loss", trained, lambda r: r["loss"]),
                             ("train/accuracy_k3", trained, lambda r: r["accuracy"][2]),
                             ("train/lr", records, lambda r: r["lr"])):
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert steps == [r["step"] for r in rows], (tag, steps)
        for e, r in zip(events, rows):
            assert math.isclose(e.value, value(r), rel_tol=1e-6), (tag, e.step, e.value, value(r))
            assert e.wall_time == r["time"], (tag, e.wall_time, r["time"])


def check_plots(log_dir):
    for name, label in PLOTS.items():
        image = matplotlib.image.imread(os.path.join(log_dir, "plots", f"{name}.png"))
        assert image.shape[0] >= 300 and image.shape[1] >= 400, (name, image.shape)
        colours = len({tuple(p) for p in image.reshape(-1, image.shape[-1])[::7]})
        assert colours > 10, (name, colours)
        # The data is drawn, not just the axes: pixels of the first curve's colour C0.
        c0 = (0x1f / 255, 0x77 / 255, 0xb4 / 255)
        drawn = (abs(image[..., :3] - c0).max(axis=-1) < 0.02).sum()
        assert drawn > 200, (name, drawn)
        texts = {"".join(e.itertext()).strip() for e in
                 ET.parse(os.path.join(log_dir, "plots", f"{name}.svg")).iter()}
        assert label in texts, (name, label)
    leftovers = [f for f in os.listdir(os.path.join(log_dir, "plots")) if f.startswith(".")]
    assert not leftovers and not glob.glob(os.path.join(log_dir, ".tensorboard*")), leftovers


with tempfile.TemporaryDirectory() as log_dir:
    metrics = os.path.join(log_dir, "metrics.jsonl")
    records = [record(i) for i in range(31)]
    # An unfinished last line is a write in progress, not an error.
    write_log(metrics, records, tail='{"step": 320, "epo')
    result = run(log_dir)
    assert result.returncode == 0, result.stderr
    check_plots(log_dir)
    check_tensorboard(log_dir, records)
    assert len([r for r in records if not r["skipped"]]) == 30

    write_log(metrics, records[:20])
    result = run(log_dir, "--formats", "png")
    assert result.returncode == 0, result.stderr
    check_tensorboard(log_dir, records[:20])

    lines = [json.dumps(r) for r in records[:5]]
    for bad, problem in ((lines[2][:-1], ":3: not valid JSON"),
                         (json.dumps({k: v for k, v in records[2].items() if k != "tau"}),
                          ":3: missing key 'tau'"),
                         (lines[0], ":3: step 10 does not follow step 20")):
        with open(metrics, "w") as f:
            f.write("\n".join(lines[:2] + [bad] + lines[3:]) + "\n")
        result = run(log_dir)
        assert result.returncode == 2 and f"dflex-report: {metrics}{problem}" in result.stderr, \
            (problem, result.returncode, result.stderr)
    open(metrics, "w").close()
    result = run(log_dir)
    assert result.returncode == 2 and "no logged steps yet" in result.stderr, result.stderr
    result = run(os.path.join(log_dir, "absent"))
    assert result.returncode == 2 and "absent/metrics.jsonl" in result.stderr, result.stderr

    # A Python without matplotlib: a package of that name that fails to import stands in for it.
    fake = os.path.join(log_dir, "fake", "matplotlib")
    os.makedirs(fake)
    with open(os.path.join(fake, "__init__.py"), "w") as f:
        f.write("raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n")
    write_log(metrics, records[:3])
    result = subprocess.run([sys.executable, report, log_dir], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.path.dirname(fake)})
    assert result.returncode == 3 and "'matplotlib'" in result.stderr \
        and "pip install matplotlib" in result.stderr, (result.returncode, result.stderr)
print("dflex-report: plots readable, TensorBoard scalars equal the log and follow a truncation, "
      "bad lines named, missing module named")
