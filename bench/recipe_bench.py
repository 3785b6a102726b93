#!/usr/bin/env python3
"""dflex-train against the PyTorch DFlash recipe (bench/recipe_baseline.py), side by side in one call
on one GPU, target and drafter co-located: a random target with Qwen3-8B's layer shapes (hidden
4096, 32 query and 8 key/value heads of 128, intermediate 12288, vocabulary 151,936; --layers of
them, default 12), the published drafter for it (5 layers: 4 sliding-window 2048 + 1 full; target
layers spread over 1 .. L-3), 512 anchors, blocks of 16, 8192 context tokens per step, the recipe's
AdamW and schedule.

dflex-train runs first and writes its initial drafter (--checkpoint-initial) and every batch
(--write-batches); the baseline starts from that drafter and trains on those batches, so both run
the same rows, anchors, labels and weights. The losses of the first steps must agree (bfloat16
rounding); then the table: tokens/s, the step's parts, peak memory, the first step from launch (the
baseline's compile included), the slowest later step against the median, and the ratio
dflex / baseline of this call.

usage: recipe_bench.py BUILD_DIR BUNDLES_DIR [--steps N] [--layers L]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from train_common import make_data, make_qwen3_target

parser = argparse.ArgumentParser()
parser.add_argument("build")
parser.add_argument("bundles")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--layers", type=int, default=12)
parser.add_argument("--agreement-steps", type=int, default=3)
args = parser.parse_args()
work = tempfile.mkdtemp(prefix="dflex-recipe-bench-")
here = os.path.dirname(os.path.abspath(__file__))

start = time.time()
make_qwen3_target(os.path.join(work, "target"), layers=args.layers, hidden=4096, intermediate=12288)
make_data(os.path.join(work, "data.jsonl"))
print(f"target ({args.layers} layers of Qwen3-8B's shapes) and data made in {time.time() - start:.0f} s",
      flush=True)

config = os.path.join(work, "train.yaml")
with open(config, "w") as f:
    f.write(f"""target:
  dir: {work}/target
drafter:
  num_layers: 5
  layer_types: [sliding_attention, sliding_attention, sliding_attention, sliding_attention, full_attention]
  sliding_window: 2048
  mask_token_id: 151935
kernels:
  drafter_bundle: {args.bundles}/dflash
  drafter_sliding_bundle: {args.bundles}/dflash_sliding_window
  target_bundle: {args.bundles}/document_mask
  target_full_spec: document_attention
data:
  path: {work}/data.jsonl
  token_budget: 8192
  max_anchors: 512
train:
  max_steps: {args.steps}
checkpoint:
  dir: {work}/dflex
  interval: 1000000
log:
  interval: 1
devices: [cuda]
""")

train = os.path.join(args.build, "bin", "dflex-train")
subprocess.run([train, "--config", config, "--dry-run"], check=True)
launch = time.time()
run = subprocess.run([train, "--config", config, "--plain", "--no-report", "--checkpoint-initial",
                      "--write-batches", os.path.join(work, "batches")])
if run.returncode != 0:
    sys.exit(f"recipe_bench: dflex-train exited {run.returncode}")
dflex = [json.loads(line) for line in open(os.path.join(work, "dflex", "metrics.jsonl"))]

baseline_log = os.path.join(work, "baseline.jsonl")
baseline_launch = time.time()
run = subprocess.run([sys.executable, os.path.join(here, "recipe_baseline.py"), "--target", f"{work}/target",
                      "--drafter", os.path.join(work, "dflex", "step-00000000"),
                      "--batches", os.path.join(work, "batches"), "--steps", str(args.steps),
                      "--out", baseline_log])
if run.returncode != 0:
    sys.exit(f"recipe_bench: the baseline exited {run.returncode}")
baseline = [json.loads(line) for line in open(baseline_log)]

# Both compute the same thing: the first steps' losses on the same batches from the same drafter.
failures = 0
print("\n| step | dflex-train loss | PyTorch recipe loss | relative difference |\n|---|---|---|---|")
for ours, theirs in zip(dflex[:args.agreement_steps], baseline[:args.agreement_steps]):
    difference = abs(ours["loss"] - theirs["loss"]) / abs(theirs["loss"])
    failures += difference > 2e-2
    print(f"| {ours['step']} | {ours['loss']:.4f} | {theirs['loss']:.4f} | {difference:.2e} |")


def step_seconds(lines, launched):
    times = [launched] + [line["time"] for line in lines]
    return [b - a for a, b in zip(times, times[1:])]


warm = max(2, args.steps // 10)  # steps left out of the means: compile, autotune, first allocations
ours_steps, theirs_steps = step_seconds(dflex, launch), step_seconds(baseline, baseline_launch)
ours_tps = statistics.mean(line["tokens_per_s"] for line in dflex[warm:])
theirs_tps = statistics.mean(line["context_tokens"] / line["seconds"] for line in baseline[warm:])
ours_peak = max(max(line["peak_memory_bytes"].values()) for line in dflex) / 2**30
theirs_peak = max(line["peak_memory_bytes"] for line in baseline) / 2**30


def mean_part(lines, part):
    return statistics.mean(line["times_ms"][part] for line in lines[warm:])


def stall(seconds):
    later = seconds[1:]
    return max(later) / statistics.median(later)


print(f"\n| {args.steps} updates, means after {warm} | dflex-train | PyTorch recipe | dflex / recipe |")
print("|---|---|---|---|")
print(f"| context tokens/s | {ours_tps:.0f} | {theirs_tps:.0f} | {ours_tps / theirs_tps:.2f}x |")
for part in ("target_forward", "drafter_forward", "backward", "optimizer"):
    print(f"| {part} ms | {mean_part(dflex, part):.1f} | {mean_part(baseline, part):.1f} | |")
print(f"| peak memory GiB | {ours_peak:.2f} | {theirs_peak:.2f} | {ours_peak / theirs_peak:.2f}x |")
print(f"| launch to the end of step 1 s | {ours_steps[0]:.1f} | {theirs_steps[0]:.1f} | |")
print(f"| slowest later step / median | {stall(ours_steps):.2f} | {stall(theirs_steps):.2f} | |")
print(f"| loss step 1 -> {args.steps} | {dflex[0]['loss']:.3f} -> {dflex[-1]['loss']:.3f} | "
      f"{baseline[0]['loss']:.3f} -> {baseline[-1]['loss']:.3f} | |")
if failures:
    sys.exit(f"recipe_bench: {failures} of the first {args.agreement_steps} losses disagree by more than 2%")
