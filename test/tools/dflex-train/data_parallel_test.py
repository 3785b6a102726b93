#!/usr/bin/env python3
"""dflex-train over data-parallel ranks on the CPU (c10d, Gloo), started as torchrun starts them
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT): two and three ranks
train as one rank with the same global batch (loss sequence within float tolerance, the ranks'
weights checked equal every log interval by the trainer), a run resumed on another number of ranks
continues the same row order (on the same number, bitwise the uninterrupted run), non-finite steps
stop every rank together, a signal to one rank stops all of them after one checkpoint, and a
crashed or hanging rank ends the others with a message naming the collective; torchrun (whose agent
hosts the store) starts the same run.

usage: data_parallel_test.py DFLEX_TRAIN TARGET_REFERENCE_PY"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from train_fixture import check, latest_state, losses, make_run

train, target_reference = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="dflex-dp-test-")
config = make_run(work, target_reference)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(ranks, run_dir, *settings, resume=False):
    port = free_port()
    processes = []
    for rank in range(ranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        args = [train, "--config", config, "--plain", "--no-report", "--set",
                f"checkpoint.dir={run_dir}", *settings]
        if resume:
            args += ["--resume", "latest"]
        processes.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
    return processes


def finish(processes, timeout=300):
    results = []
    for process in processes:
        out, err = process.communicate(timeout=timeout)
        results.append((process.returncode, out, err))
    return results


def run(ranks, run_dir, *settings, resume=False):
    results = finish(start(ranks, run_dir, *settings, resume=resume))
    for rank, (code, out, err) in enumerate(results):
        check(code == 0, f"{ranks} ranks: rank {rank} exited {code}: {err[-2000:]}")
    return results


def close(a, b, what):
    check(len(a) == len(b), f"{what}: {len(a)} and {len(b)} steps")
    for step, (x, y) in enumerate(zip(a, b), 1):
        check(abs(x - y) <= 1e-4 * abs(x), f"{what}: step {step}: {x} and {y}")


# Two and three ranks are one rank with the same global batch.
for ranks in (2, 3):
    one, many = os.path.join(work, f"one-{ranks}"), os.path.join(work, f"ranks-{ranks}")
    run(1, one, "train.max_steps=6", f"optimizer.grad_accumulation={ranks}")
    run(ranks, many, "train.max_steps=6")
    close(losses(one), losses(many), f"1 rank x {ranks} micro-steps against {ranks} ranks")
    check(latest_state(one)["data"] == latest_state(many)["data"], "the data cursors differ")
    state_file = os.path.join(many, "step-00000006", "training_state.safetensors")
    with safe_open(state_file, "pt") as tensors:
        shape = tensors.get_slice("rng.torch_cpu").get_shape()
    check(shape[0] == ranks, f"the checkpoint holds {shape[0]} generator states for {ranks} ranks")

# torchrun itself (its agent hosts the store: TORCHELASTIC_USE_AGENT_STORE) gives the same run.
launched = os.path.join(work, "torchrun")
result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                         "--master-port", str(free_port()), "--no-python", train, "--config", config,
                         "--plain", "--no-report", "--set", f"checkpoint.dir={launched}", "train.max_steps=6"],
                        env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
check(result.returncode == 0, f"torchrun exited {result.returncode}: {result.stderr[-2000:]}")
close(losses(os.path.join(work, "one-2")), losses(launched), "1 rank x 2 micro-steps against torchrun's 2 ranks")

# A rank whose rows have no anchor at all (one loss position, at the end) still takes every step.
sparse = os.path.join(work, "sparse.jsonl")
with open(sparse, "w") as f:
    for i in range(12):
        ids = [(5 * i + 3 * t) % 500 for t in range(64)]  # one sample fills a row
        mask = [int(t >= 2) for t in range(64)] if i % 2 == 0 else [int(t == 63) for t in range(64)]
        f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
one, many = os.path.join(work, "sparse-one"), os.path.join(work, "sparse-two")
run(1, one, "train.max_steps=5", "optimizer.grad_accumulation=2", f"data.path={sparse}")
run(2, many, "train.max_steps=5", f"data.path={sparse}")
close(losses(one), losses(many), "a rank without anchors")

# Interrupted and resumed on the same two ranks: bitwise the uninterrupted two-rank run.
halves = os.path.join(work, "halves")
run(2, halves, "train.max_steps=6", "checkpoint.interval=3", "train.epochs=1")
whole = os.path.join(work, "whole-2")
run(2, whole, "train.max_steps=6", "train.epochs=1")
shutil.rmtree(os.path.join(halves, "step-00000006"))
with open(os.path.join(halves, "latest"), "w") as f:
    f.write("step-00000003\n")
run(2, halves, "train.max_steps=6", "checkpoint.interval=3", "train.epochs=1", resume=True)
check(losses(halves) == losses(whole), f"resumed on 2 ranks: {losses(halves)} against {losses(whole)}")

# Non-finite steps: every rank skips them and all stop together after train.max_bad_steps.
nan_target = os.path.join(work, "nan-model")
shutil.copytree(os.path.join(work, "model"), nan_target)
weights = load_file(os.path.join(nan_target, "model.safetensors"))
weights["model.embed_tokens.weight"][:] = float("nan")
save_file(weights, os.path.join(nan_target, "model.safetensors"))
results = finish(start(2, os.path.join(work, "nan"), f"target.dir={nan_target}", "train.max_bad_steps=2"))
for rank, (code, out, err) in enumerate(results):
    check(code == 1 and "step 2: 2 steps in a row" in err, f"NaN run: rank {rank} exited {code}: {err[-800:]}")

# Resumed on three ranks, a two-rank run continues the row order: 2 rows per update, then 3.
resumed = os.path.join(work, "resumed")
run(2, resumed, "train.max_steps=3")
run(3, resumed, "train.max_steps=5", resume=True)
state = latest_state(resumed)
check(state["step"] == 5 and state["world_size"] == 3, f"resumed state {state}")
check(state["data"][0]["rows_in_epoch"] == 2 * 3 + 3 * 2, f"rows taken {state['data'][0]}")
check([round(x, 6) for x in losses(resumed)[:2]] == [round(x, 6) for x in losses(os.path.join(work, "ranks-2"))[:2]],
      "the first updates of the resumed run differ from the two-rank run's")


def wait_for_steps(run_dir, count, processes, timeout=120):
    deadline = time.time() + timeout
    path = os.path.join(run_dir, "metrics.jsonl")
    while time.time() < deadline:
        if os.path.exists(path) and sum(1 for _ in open(path)) >= count:
            return
        check(all(p.poll() is None for p in processes), "a rank ended early")
        time.sleep(0.05)
    sys.exit("dflex-train test: no progress")


long_run = ("train.max_steps=100000", "checkpoint.interval=100000", "distributed.timeout_s=8")

# SIGTERM to rank 1 only: both ranks checkpoint the same step and exit 0.
stopped = os.path.join(work, "stopped")
processes = start(2, stopped, *long_run)
wait_for_steps(stopped, 3, processes)
processes[1].send_signal(signal.SIGTERM)
results = finish(processes, timeout=60)
for rank, (code, out, err) in enumerate(results):
    check(code == 0, f"SIGTERM: rank {rank} exited {code}: {err[-1500:]}")
check("stopped by signal" in results[0][1], results[0][1][-500:])
check(latest_state(stopped)["step"] >= 3, "no checkpoint after the signal")

# A crashed rank: the other stops, naming the collective.
crashed = os.path.join(work, "crashed")
processes = start(2, crashed, *long_run)
wait_for_steps(crashed, 3, processes)
processes[1].kill()
begin = time.time()
code, out, err = finish(processes[:1], timeout=60)[0]
processes[1].wait()
check(code != 0 and "collective" in err and "rank 0 of 2" in err, f"after a crash: exit {code}: {err[-1500:]}")
check(time.time() - begin < 30, "rank 0 took too long to notice the crash")

# A hanging rank (stopped, not dead): the other stops after the timeout, naming it.
hung = os.path.join(work, "hung")
processes = start(2, hung, *long_run)
wait_for_steps(hung, 3, processes)
processes[1].send_signal(signal.SIGSTOP)
begin = time.time()
code, out, err = finish(processes[:1], timeout=60)[0]
waited = time.time() - begin
processes[1].kill()
processes[1].wait()
check(code != 0 and "did not finish within 8 s" in err, f"after a hang: exit {code}: {err[-1500:]}")
check(waited < 40, f"rank 0 waited {waited:.0f} s for a hung rank")
print(f"data_parallel_test: 2 and 3 ranks equal 1 rank (also under torchrun, and with a rank without anchors), "
      f"a 2-rank resume is bitwise, non-finite steps stop every rank, resume from 2 onto 3 ranks continues the rows, "
      f"SIGTERM to one rank stops both, a crash and a hang ({waited:.0f} s) end the other rank")
