#!/usr/bin/env python3
"""dflex-train against the PyTorch DFlash recipe (bench/recipe_baseline.py), side by side in one call
on one GPU, target and drafter co-located, 512 anchors, blocks of 16, 8192 context tokens per step,
the recipe's AdamW and schedule, on one of two random targets:

- dense (default): Qwen3-8B's layer shapes (hidden 4096, 32 query and 8 key/value heads of 128,
  intermediate 12288, vocabulary 151,936), --layers of them (default 12), with the published
  drafter for it: 5 layers, 4 sliding-window 2048 + 1 full, target layers spread over 1 .. L-3;
- hybrid: a Qwen3.5 hybrid with 27B-class layer shapes (hidden 5120; gated attention of 24 query
  and 4 key/value heads of 256; gated-delta layers of 16 key and 48 value heads of 128, three per
  attention layer; intermediate 17408), --layers of them (default 8), the same drafter with 32/8
  heads of 128 (the examples' specs); the baseline's gated-delta layers run FLA's kernels when
  third_party_bench/fla-src is there (transformers' own PyTorch recurrence otherwise).

dflex-train runs first and writes its initial drafter (--checkpoint-initial) and every batch
(--write-batches); the baseline starts from that drafter and trains on those batches, so both run
the same rows, anchors, labels and weights. The losses and gradient norms of the first steps must
agree (bfloat16 rounding, 2%); then the table: tokens/s, the step's parts, peak memory, the first step from launch
(the baseline's compile included), the slowest later step against the median, and the ratio
dflex / baseline of this call. --changed-steps N pads the baseline's last N steps to 128 more blocks, a
new shape as after a change of max_anchors or the length: the first of them is what that costs it.

--smoke runs the same comparison on the CPU with tiny models (no bundles: dflex's CPU paths, the
baseline with SDPA on a dense mask, as flex_attention has no CPU backward): a check that both
trainers compute the same thing, not a measurement.

--dflex-only runs dflex-train's half alone (its step parts, no ratio). The work folder (the target,
checkpoints, batches: tens of GB at the GPU shapes) is removed at the end unless --keep. --resume WORK
takes a kept folder whose dflex-train half finished (a call whose time limit ended the baseline) and
runs the baseline and the table from it, with the same --target, --steps and --smoke as that call.

usage: recipe_bench.py BUILD_DIR [BUNDLES_DIR] [--target dense|hybrid] [--steps N] [--layers L] [--smoke]
                       [--dflex-only] [--keep] [--changed-steps N] [--resume WORK]"""
import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import yaml
from safetensors.torch import load_file
from train_common import make_data, make_qwen35_target, make_qwen3_target

parser = argparse.ArgumentParser()
parser.add_argument("build")
parser.add_argument("bundles", nargs="?")
parser.add_argument("--target", choices=("dense", "hybrid"), default="dense")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--layers", type=int)
parser.add_argument("--agreement-steps", type=int, default=3)
parser.add_argument("--smoke", action="store_true")
parser.add_argument("--dflex-only", action="store_true")
parser.add_argument("--keep", action="store_true")
parser.add_argument("--changed-steps", type=int, default=0,
                    help="the baseline's last N steps padded to 128 more blocks: a new shape, as after a change "
                         "of max_anchors or the length (out of the means)")
parser.add_argument("--resume", metavar="WORK",
                    help="a kept work folder whose dflex-train half finished: run the baseline and the table")
args = parser.parse_args()
if not args.smoke and not args.bundles:
    parser.error("BUNDLES_DIR is needed on the GPU (--smoke runs without)")
work = args.resume or tempfile.mkdtemp(prefix="dflex-recipe-bench-")
# When dflex-train was launched: its first step is counted from there, in this call or a resumed one.
launch_file = os.path.join(work, "dflex-launch-time")
if args.resume and not os.path.isfile(launch_file):
    sys.exit(f"recipe_bench: {work} holds no finished dflex-train half to resume (no {launch_file})")
if not args.keep:
    atexit.register(shutil.rmtree, work, ignore_errors=True)
here = os.path.dirname(os.path.abspath(__file__))
device = "cpu" if args.smoke else "cuda"
target_dir = os.path.join(work, "target")


def make_target():
    if args.smoke:
        # Tiny shapes with the real structure: grouped heads, sliding-window and full drafter layers.
        shapes = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=512, device="cpu")
        if args.target == "dense":
            make_qwen3_target(target_dir, layers=args.layers or 6, head_dim=16, **shapes)
        else:
            make_qwen35_target(target_dir, layers=args.layers or 8, head_dim=32, linear_key_heads=2,
                               linear_value_heads=4, linear_dim=16, **shapes)
    elif args.target == "dense":
        make_qwen3_target(target_dir, layers=args.layers or 12, hidden=4096, intermediate=12288)
    else:
        make_qwen35_target(target_dir, layers=args.layers or 8, hidden=5120, intermediate=17408, heads=24,
                           kv_heads=4, head_dim=256, linear_key_heads=16, linear_value_heads=48,
                           linear_dim=128)


if args.smoke:
    budget, anchors, block, window, mask_token = 256, 16, 4, 32, 511
else:
    budget, anchors, block, window, mask_token = 8192, 512, 16, 2048, 151935
if not args.resume:
    start = time.time()
    make_target()
    if args.smoke:
        make_data(os.path.join(work, "data.jsonl"), samples=80, lengths=(40, 200), top=500)
    else:
        make_data(os.path.join(work, "data.jsonl"))
    print(f"{args.target} target and data made in {time.time() - start:.0f} s", flush=True)


def write_config():
    """dflex-train's config for this call's shapes; returns its path."""
    drafter = {"num_layers": 5, "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
               "sliding_window": window, "block_size": block, "mask_token_id": mask_token}
    config = {"target": {"dir": target_dir}, "drafter": drafter,
              "data": {"path": os.path.join(work, "data.jsonl"), "token_budget": budget, "max_anchors": anchors},
              "train": {"max_steps": args.steps},
              "checkpoint": {"dir": os.path.join(work, "dflex"), "interval": 1000000},
              "log": {"interval": 1}, "devices": [device]}
    if args.smoke:
        config["target"]["dtype"] = drafter["dtype"] = "float32"
    else:
        config["kernels"] = {"drafter_bundle": f"{args.bundles}/dflash",
                             "drafter_sliding_bundle": f"{args.bundles}/dflash_sliding_window"}
        if args.target == "dense":
            config["kernels"].update(target_bundle=f"{args.bundles}/document_mask",
                                     target_full_spec="document_attention")
        else:
            drafter.update(num_attention_heads=32, num_key_value_heads=8, head_dim=128)
            hybrid_specs = f"{args.bundles}/recipe_hybrid_target"
            config["kernels"].update(target_bundle=hybrid_specs, target_full_spec="recipe_hybrid_attention",
                                     target_gated_delta_bundle=hybrid_specs,
                                     target_gated_delta_spec="recipe_hybrid_gated_delta")
    config_path = os.path.join(work, "train.yaml")
    with open(config_path, "w") as f:
        yaml.safe_dump(config, f)
    return config_path


train = os.path.join(args.build, "bin", "dflex-train")
if not args.resume:
    config_path = write_config()
    subprocess.run([train, "--config", config_path, "--dry-run"], check=True)
    launch = time.time()
    run = subprocess.run([train, "--config", config_path, "--plain", "--no-report", "--checkpoint-initial",
                          "--write-batches", os.path.join(work, "batches")])
    if run.returncode != 0:
        sys.exit(f"recipe_bench: dflex-train exited {run.returncode}")
    with open(launch_file, "w") as f:
        f.write(repr(launch))
with open(launch_file) as f:
    launch = float(f.read())
dflex = [json.loads(line) for line in open(os.path.join(work, "dflex", "metrics.jsonl"))]
if len(dflex) != args.steps:
    sys.exit(f"recipe_bench: {work}: dflex-train logged {len(dflex)} steps, not --steps {args.steps}")
warm = max(2, args.steps // 10)  # steps left out of the means: compile, autotune, first allocations
PARTS = ("target_forward", "drafter_forward", "backward", "optimizer")


def mean_part(lines, part):
    return statistics.mean(line["times_ms"][part] for line in lines[warm:])


ours_tps = statistics.mean(line["tokens_per_s"] for line in dflex[warm:])
if args.dflex_only:
    print(f"\n| {args.steps} updates, means after {warm} | dflex-train |\n|---|---|")
    print(f"| context tokens/s | {ours_tps:.0f} |")
    for part in PARTS:
        print(f"| {part} ms | {mean_part(dflex, part):.1f} |")
    sys.exit(0)

baseline_log = os.path.join(work, "baseline.jsonl")
baseline_launch = time.time()
fla = os.path.join(here, "..", "third_party_bench", "fla-src")
with_fla = os.path.isdir(fla) and not args.smoke  # FLA's kernels are Triton's: GPU only
environment = dict(os.environ)
if with_fla:
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [fla, environment.get("PYTHONPATH")]))
if args.target == "hybrid":
    print("the baseline's gated-delta layers:", "FLA" if with_fla else "transformers' PyTorch recurrence")
run = subprocess.run([sys.executable, os.path.join(here, "recipe_baseline.py"), "--target", target_dir,
                      "--drafter", os.path.join(work, "dflex", "step-00000000"),
                      "--batches", os.path.join(work, "batches"), "--steps", str(args.steps),
                      "--out", baseline_log, "--device", device, "--max-anchors", str(anchors)]
                     + (["--changed-steps", str(args.changed_steps), "--changed-anchors", str(anchors + 128)]
                        if args.changed_steps else [])
                     + (["--loss-chunk", "32"] if args.smoke else []), env=environment)
if run.returncode != 0:
    sys.exit(f"recipe_bench: the baseline exited {run.returncode}")
baseline = [json.loads(line) for line in open(baseline_log)]
# The last --changed-steps lines are the new padded shape's: out of the means and the stall figure.
regular = len(baseline) - args.changed_steps
baseline, changed = baseline[:regular], baseline[regular:]

# Both compute the same thing: the first steps' losses and gradient norms on the same batches from
# the same drafter (the gradient tells more than the loss of a drafter that still predicts little).
failures = 0
print("\n| step | dflex-train loss | PyTorch recipe loss | gradient norms | largest relative difference |")
print("|---|---|---|---|---|")
for ours, theirs in zip(dflex[:args.agreement_steps], baseline[:args.agreement_steps]):
    difference = max(abs(ours[key] - theirs[key]) / abs(theirs[key]) for key in ("loss", "grad_norm"))
    failures += difference > 2e-2
    print(f"| {ours['step']} | {ours['loss']:.4f} | {theirs['loss']:.4f} | "
          f"{ours['grad_norm']:.4f} / {theirs['grad_norm']:.4f} | {difference:.2e} |")


def step_seconds(lines, launched):
    times = [launched] + [line["time"] for line in lines]
    return [b - a for a, b in zip(times, times[1:])]


ours_steps, theirs_steps = step_seconds(dflex, launch), step_seconds(baseline + changed, baseline_launch)
changed_steps, theirs_steps = theirs_steps[regular:], theirs_steps[:regular]
theirs_tps = statistics.mean(line["context_tokens"] / line["seconds"] for line in baseline[warm:])
ours_peak = max(max(line["peak_memory_bytes"].values()) for line in dflex) / 2**30
theirs_peak = max(line["peak_memory_bytes"] for line in baseline) / 2**30


def stall(seconds):
    later = seconds[1:]
    return max(later) / statistics.median(later)


print(f"\n| {args.steps} updates, means after {warm} | dflex-train | PyTorch recipe | dflex / recipe |")
print("|---|---|---|---|")
print(f"| context tokens/s | {ours_tps:.0f} | {theirs_tps:.0f} | {ours_tps / theirs_tps:.2f}x |")
for part in PARTS:
    print(f"| {part} ms | {mean_part(dflex, part):.1f} | {mean_part(baseline, part):.1f} | |")
if theirs_peak > 0:  # CUDA's allocator; not counted on the CPU
    print(f"| peak memory GiB | {ours_peak:.2f} | {theirs_peak:.2f} | {ours_peak / theirs_peak:.2f}x |")
print(f"| launch to the end of step 1 s | {ours_steps[0]:.1f} | {theirs_steps[0]:.1f} | |")
print(f"| slowest later step / median | {stall(ours_steps):.2f} | {stall(theirs_steps):.2f} | |")
# dflex-train's steps each keep their own shape (the batches it wrote): the stall figure above
# already covers a change of the anchor count or of the context length.
shapes = [load_file(os.path.join(work, "batches", f"batch-{line['step']:08d}-rank0-micro0.safetensors"))
          for line in dflex]
anchor_counts = [int(s["anchors"].shape[1]) for s in shapes]
context_lengths = [int((s["document_ids"] >= 0).sum()) for s in shapes]
print(f"| anchors / context tokens over the steps | {min(anchor_counts)}-{max(anchor_counts)} / "
      f"{min(context_lengths)}-{max(context_lengths)}, {len(set(zip(anchor_counts, context_lengths)))} shapes "
      f"| padded to {baseline[0]['padded_blocks']} blocks | |")
if changed:
    # dflex pads no block: its kernels take every anchor count and length at run time.
    print(f"| first step padded to {changed[0]['padded_blocks']} blocks s (median) | no padding | "
          f"{changed_steps[0]:.1f} ({statistics.median(theirs_steps[1:]):.2f}) | |")
print(f"| loss step 1 -> {args.steps} | {dflex[0]['loss']:.3f} -> {dflex[-1]['loss']:.3f} | "
      f"{baseline[0]['loss']:.3f} -> {(baseline + changed)[-1]['loss']:.3f} | |")
if failures:
    sys.exit(f"recipe_bench: {failures} of the first {args.agreement_steps} steps disagree by more than 2%")
