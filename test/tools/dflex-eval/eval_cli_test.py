#!/usr/bin/env python3
"""dflex-eval on a drafter dflex-train wrote for a tiny Qwen3 target: the speculative output is the
target's greedy decoding (lossless), the JSON results carry tau and the per-position acceptance,
and bad prompts are named with exit 2.

usage: eval_cli_test.py DFLEX_EVAL DFLEX_TRAIN TARGET_REFERENCE_PY"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dflex-train"))
from train_fixture import check, make_run  # noqa: E402

evaluate, train, target_reference = sys.argv[1:4]
work = tempfile.mkdtemp(prefix="dflex-eval-test-")
config = make_run(work, target_reference)
run_dir = os.path.join(work, "run")
trained = subprocess.run([train, "--config", config, "--plain", "--no-report", "--set",
                          f"checkpoint.dir={run_dir}", "train.max_steps=20"], capture_output=True, text=True)
check(trained.returncode == 0, "dflex-train failed: " + trained.stderr[-1500:])
drafter = os.path.join(run_dir, open(os.path.join(run_dir, "latest")).read().strip())

prompts = os.path.join(work, "prompts.jsonl")
with open(prompts, "w") as f:
    for prompt in ([5, 17, 29, 41], [300, 301, 302], [7] * 6):
        f.write(json.dumps({"input_ids": prompt}) + "\n")
out = os.path.join(work, "results.json")
result = subprocess.run([evaluate, "--target", os.path.join(work, "model"), "--drafter", drafter,
                         "--prompts", prompts, "--max-new-tokens", "12", "--dtype", "float64",
                         "--out", out], capture_output=True, text=True)
check(result.returncode == 0, f"dflex-eval exited {result.returncode}: {result.stderr[-1500:]}")
results = json.load(open(out))
check(results["lossless"] is True and results["tokens"] == 36, f"results {results}")
check(results["tau"] >= 1.0 and len(results["accepted_at_least_k"]) == 3, f"results {results}")
check("| " + drafter in result.stdout, result.stdout)

with open(prompts, "a") as f:
    f.write('{"input_ids": [1, 2, 900]}\n')
result = subprocess.run([evaluate, "--target", os.path.join(work, "model"), "--drafter", drafter,
                         "--prompts", prompts, "--max-new-tokens", "4"], capture_output=True, text=True)
check(result.returncode == 2 and "prompt token 900" in result.stderr, f"bad prompt: {result.stderr[-800:]}")
print(f"eval_cli_test: lossless, tau {results['tau']:.3f}, bad prompt named")
