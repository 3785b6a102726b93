#!/usr/bin/env python3
"""A co-located dflex-train run on one GPU: a random Qwen3 target of 8 layers of hidden 1024
(Qwen3-8B's attention: 32 query and 8 key/value heads of 128, its 151,936-token vocabulary) and a
3-layer DFlash drafter, at the recipe's token budget (8192 context tokens, 512 blocks of 16).
Prints tokens/s, the step-time breakdown and peak memory from the run's metrics.jsonl (the first
log interval, warm-up, left out), the same for a drafter with a gated-delta first layer (through the
dflex gated-delta op and by the LibTorch rule), then checks that an out-of-memory step is reported
with the memory plan and a non-zero exit.

usage: train_bench.py BUILD_DIR BUNDLES_DIR [--steps N]"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from train_common import make_data, make_qwen3_target

parser = argparse.ArgumentParser()
parser.add_argument("build")
parser.add_argument("bundles")
parser.add_argument("--steps", type=int, default=200)
args = parser.parse_args()
train = os.path.join(args.build, "bin", "dflex-train")
work = tempfile.mkdtemp(prefix="dflex-train-bench-")


start = time.time()
make_qwen3_target(os.path.join(work, "target"), layers=8, hidden=1024, intermediate=3072)
make_data(os.path.join(work, "data.jsonl"))
print(f"target and data made in {time.time() - start:.0f} s", flush=True)

config = os.path.join(work, "train.yaml")
with open(config, "w") as f:
    f.write(f"""target:
  dir: {work}/target
drafter:
  num_layers: 3
  mask_token_id: 151935
kernels:
  drafter_bundle: {args.bundles}/dflash
  drafter_full_spec: drafter_attention
  target_bundle: {args.bundles}/document_mask
  target_full_spec: document_attention
data:
  path: {work}/data.jsonl
train:
  max_steps: {args.steps}
checkpoint:
  dir: {work}/run
  interval: 1000000
log:
  interval: 20
devices: [cuda]
""")

subprocess.run([train, "--config", config, "--dry-run"], check=True)
start = time.time()
run = subprocess.run([train, "--config", config, "--plain", "--no-report"])
wall = time.time() - start
if run.returncode != 0:
    sys.exit(f"train_bench: dflex-train exited {run.returncode}")

lines = [json.loads(line) for line in open(os.path.join(work, "run", "metrics.jsonl"))]
measured = lines[1:]  # the first interval holds the warm-up
parts = list(measured[0]["times_ms"])
print(f"\n| dflex-train, {args.steps} updates, 8192 context tokens, 512 blocks of 16 | value |")
print("|---|---|")
print(f"| tokens/s (context tokens, mean of logged intervals after warm-up) | "
      f"{statistics.mean(l['tokens_per_s'] for l in measured):.0f} |")
for part in parts:
    print(f"| {part} ms / update | {statistics.mean(l['times_ms'][part] for l in measured):.1f} |")
peak = max(max(l["peak_memory_bytes"].values()) for l in measured)
print(f"| peak memory (GiB) | {peak / 2**30:.2f} |")
print(f"| loss first -> last interval | {lines[0]['loss']:.3f} -> {lines[-1]['loss']:.3f} |")
print(f"| tau last interval | {lines[-1]['tau']:.3f} |")
print(f"| wall time of the run incl. start-up (s) | {wall:.1f} |")

# dflex-eval on the trained drafter: 8 held-out prompts, 64 new tokens, float32 on the GPU.
prompts = os.path.join(work, "prompts.jsonl")
rng = random.Random(7)
with open(prompts, "w") as f:
    for _ in range(8):
        start, stride = rng.randrange(150000), rng.randrange(1, 7)
        f.write(json.dumps({"input_ids": [(start + stride * i) % 151000 for i in range(48)]}) + "\n")
latest = open(os.path.join(work, "run", "latest")).read().strip()
evaluated = subprocess.run([os.path.join(args.build, "bin", "dflex-eval"), "--target", f"{work}/target",
                            "--drafter", os.path.join(work, "run", latest), "--prompts", prompts,
                            "--max-new-tokens", "64", "--device", "cuda", "--dtype", "float32",
                            "--out", os.path.join(work, "eval.json")], capture_output=True, text=True)
print(evaluated.stdout, evaluated.stderr[-600:])
if evaluated.returncode not in (0, 1):
    sys.exit(f"train_bench: dflex-eval exited {evaluated.returncode}")
print("dflex-eval:", open(os.path.join(work, "eval.json")).read())

# A drafter whose first layer is a gated-delta (linear_attention) layer, the rest as above, 60
# updates each: the layer through the dflex gated-delta op (bench/specs/bench_drafter_gated_delta)
# and by the plain LibTorch rule, tokens/s against the all-attention drafter's of this call.
attention_tokens_per_s = statistics.mean(l["tokens_per_s"] for l in measured)
for path, setting in (("the gated-delta op", f"kernels.drafter_gated_delta_bundle={args.bundles}/bench_drafter_gated_delta"),
                      ("the LibTorch rule", 'kernels.drafter_gated_delta_spec=""')):
    folder = f"{work}/gdn-" + path.split()[-1]
    gdn = subprocess.run([train, "--config", config, "--plain", "--no-report", "--set",
                          "drafter.layer_types=[linear_attention, full_attention, full_attention]",
                          "train.max_steps=60", f"checkpoint.dir={folder}", setting])
    if gdn.returncode != 0:
        sys.exit(f"train_bench: the gated-delta drafter run by {path} exited {gdn.returncode}")
    lines = [json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl"))]
    gdn_tokens_per_s = statistics.mean(l["tokens_per_s"] for l in lines[1:])
    print(f"\n| drafter [linear_attention, full_attention, full_attention] by {path}, 60 updates | value |\n|---|---|")
    print(f"| tokens/s | {gdn_tokens_per_s:.0f} ({gdn_tokens_per_s / attention_tokens_per_s:.2f}x the all-attention drafter) |")
    for part in ("drafter_forward", "backward"):
        print(f"| {part} ms / update | {statistics.mean(l['times_ms'][part] for l in lines[1:]):.1f} |")
    print(f"| peak memory (GiB) | {max(max(l['peak_memory_bytes'].values()) for l in lines[1:]) / 2**30:.2f} |")
    print(f"| loss first -> last interval | {lines[0]['loss']:.3f} -> {lines[-1]['loss']:.3f} |")

# The same run as a launcher starts it (one rank): its collectives go through a real NCCL group.
env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
           MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
nccl = subprocess.run([train, "--config", config, "--plain", "--no-report", "--set",
                       "train.max_steps=60", f"checkpoint.dir={work}/nccl"], env=env)
if nccl.returncode != 0:
    sys.exit(f"train_bench: the single-rank NCCL run exited {nccl.returncode}")
lines = [json.loads(line) for line in open(os.path.join(work, "nccl", "metrics.jsonl"))][1:]
print(f"\n| single-rank NCCL group, 60 updates | value |\n|---|---|")
print(f"| tokens/s | {statistics.mean(l['tokens_per_s'] for l in lines):.0f} |")
print(f"| all_reduce ms / update | {statistics.mean(l['times_ms']['all_reduce'] for l in lines):.2f} |")

# Out of memory: plain LibTorch target attention at a huge budget.
oom = subprocess.run([train, "--config", config, "--plain", "--no-report", "--set",
                      "kernels.target_bundle=\"\"", "data.token_budget=400000", "train.max_steps=1",
                      f"checkpoint.dir={work}/oom"], capture_output=True, text=True)
print("\nout-of-memory run: exit", oom.returncode)
print(oom.stderr[-1500:])
if oom.returncode == 0 or "out of memory" not in oom.stderr or "data.token_budget" not in oom.stderr:
    sys.exit("train_bench: the out-of-memory step was not reported as it should be")
