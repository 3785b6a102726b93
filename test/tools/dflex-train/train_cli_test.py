#!/usr/bin/env python3
"""dflex-train as users run it, on a tiny Qwen3 target: --help lists every key, bad configs exit 2
naming the key and where it was written, --dry-run prints the memory plan and trains nothing,
--checkpoint-initial writes the untrained drafter as step 0 before training,
SIGTERM checkpoints and exits 0 and the run resumes from it, and SIGKILL at any moment (checkpoints
written every step) leaves `latest` naming a complete, loadable checkpoint.

usage: train_cli_test.py DFLEX_TRAIN TARGET_REFERENCE_PY"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from safetensors import safe_open

from train_fixture import check, make_run

train, target_reference = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="dflex-train-test-")


def run(*args, timeout=300):
    return subprocess.run([train, *args], capture_output=True, text=True, timeout=timeout)


config = make_run(work, target_reference)
rng = random.Random(1)

# --help: every key with its default.
result = run("--help")
check(result.returncode == 0, "--help failed: " + result.stderr)
for key in ("optimizer.lr", "drafter.block_size", "data.max_anchors", "checkpoint.keep_last",
            "kernels.drafter_bundle"):
    check(key in result.stdout, f"--help does not list {key}")
check("6e-04" in result.stdout or "0.0006" in result.stdout, "--help lacks the default lr")

# Bad configurations: exit 2, the key named (and the closest valid one, and where).
result = run("--config", config, "--set", "optimizer.lrr=1e-3")
check(result.returncode == 2, f"unknown --set key exited {result.returncode}")
check("optimizer.lrr" in result.stderr and "'optimizer.lr'" in result.stderr, result.stderr)
result = run("--config", config, "--set", "data.max_anchors=0")
check(result.returncode == 2 and "data.max_anchors" in result.stderr, result.stderr)
bad = os.path.join(work, "bad.yaml")
with open(bad, "w") as f:
    f.write(open(config).read().replace("  block_size: 4", "  block_size: four"))
result = run("--config", bad)
check(result.returncode == 2 and "drafter.block_size" in result.stderr and "bad.yaml:" in result.stderr,
      result.stderr)

# --dry-run: the plan, nothing trained.
run_dir = os.path.join(work, "run")
result = run("--config", config, "--set", f"checkpoint.dir={run_dir}", "--dry-run")
check(result.returncode == 0, "dry run failed: " + result.stderr)
check("memory on cpu" in result.stdout and "rows per epoch" in result.stdout, result.stdout)
check(not os.path.exists(os.path.join(run_dir, "latest")), "the dry run trained")


def checkpoint_step(checkpoint):
    """The step of a checkpoint directory, after loading every file of it."""
    state = json.load(open(os.path.join(checkpoint, "trainer_state.json")))
    check(os.path.basename(checkpoint) == "step-%08d" % state["step"], f"{checkpoint} holds step {state['step']}")
    json.load(open(os.path.join(checkpoint, "config.json")))
    for file in ("model.safetensors", "training_state.safetensors"):
        with safe_open(os.path.join(checkpoint, file), "pt") as tensors:
            for key in tensors.keys():
                tensors.get_tensor(key)
    return state["step"]


def latest_step(directory):
    """The step of the checkpoint `latest` names."""
    return checkpoint_step(os.path.join(directory, open(os.path.join(directory, "latest")).read().strip()))


def wait_for_lines(path, count, process, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and sum(1 for _ in open(path)) >= count:
            return
        check(process.poll() is None, "the run ended early")
        time.sleep(0.05)
    sys.exit("train_cli_test: no progress")


# --checkpoint-initial: the untrained drafter as step 0, a complete checkpoint, then the run.
initial_dir = os.path.join(work, "initial")
result = run("--config", config, "--set", f"checkpoint.dir={initial_dir}", "train.max_steps=2", "--no-report",
             "--checkpoint-initial")
check(result.returncode == 0, "--checkpoint-initial failed: " + result.stderr)
check(latest_step(initial_dir) == 2, "the run after the initial checkpoint did not finish")
initial = os.path.join(initial_dir, "step-00000000")
check(checkpoint_step(initial) == 0, "the initial checkpoint is not step 0")
with safe_open(os.path.join(initial, "model.safetensors"), "pt") as before, \
        safe_open(os.path.join(initial_dir, "step-00000002", "model.safetensors"), "pt") as after:
    check(any(not before.get_tensor(k).equal(after.get_tensor(k)) for k in before.keys()),
          "the initial checkpoint holds the trained weights")

# SIGTERM: the step finishes, a checkpoint is written, exit 0; the run resumes from it.
args = ["--config", config, "--set", f"checkpoint.dir={run_dir}", "train.max_steps=100000",
        "checkpoint.interval=100000", "--no-report"]
process = subprocess.Popen([train, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
wait_for_lines(os.path.join(run_dir, "metrics.jsonl"), 3, process)
process.send_signal(signal.SIGTERM)
out, err = process.communicate(timeout=120)
check(process.returncode == 0, f"SIGTERM exited {process.returncode}: {err}")
check("stopped by signal" in out, out)
stopped = latest_step(run_dir)
check(stopped >= 3, f"checkpoint at step {stopped}")
result = run("--config", config, "--set", f"checkpoint.dir={run_dir}", f"train.max_steps={stopped + 3}",
             "checkpoint.interval=100000", "--resume", "latest")
check(result.returncode == 0, "resume failed: " + result.stderr)
check(latest_step(run_dir) == stopped + 3, "the resumed run did not finish")
steps = [json.loads(line)["step"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]
check(steps == list(range(1, stopped + 4)), f"metrics steps {steps}")
check(os.path.exists(os.path.join(run_dir, "plots", "loss.png")), "no plots after the run")

# SIGKILL at random moments, a checkpoint every step: `latest` always loads.
kill_dir = os.path.join(work, "killed")
args = ["--config", config, "--set", f"checkpoint.dir={kill_dir}", "train.max_steps=100000",
        "checkpoint.interval=1", "checkpoint.keep_last=2", "--no-report"]
kills = 0
previous = 0
for attempt in range(6):
    resume = ["--resume", "latest"] if os.path.exists(os.path.join(kill_dir, "latest")) else []
    process = subprocess.Popen([train, *args, *resume], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_for_lines(os.path.join(kill_dir, "metrics.jsonl"), previous + 2, process)
    time.sleep(rng.uniform(0.0, 0.3))
    process.kill()
    process.wait()
    kills += 1
    step = latest_step(kill_dir)
    check(step >= previous, f"latest went back from {previous} to {step}")
    previous = step
    checkpoints = [d for d in os.listdir(kill_dir) if d.startswith("step-") and "." not in d]
    check(len(checkpoints) <= 3, f"keep_last not kept: {checkpoints}")
print(f"train_cli_test: help, exit 2 on bad configs, dry run, SIGTERM at step {stopped} and resume, "
      f"{kills} SIGKILLs with latest at step {previous} loadable")
