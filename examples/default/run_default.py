"""The embedded default, end to end, with nothing downloaded: makes a small
Qwen3 target with its own tokenizer (make_target.py, on the chat tasks of
tasks.py), answers training prompts with it (dflex-data regenerate), trains a
DFlash drafter on its answers (dflex-train, train.yaml), and evaluates the
untrained and the trained drafter by speculative decoding on held-out prompts
(dflex-eval), ending with a table of both.

    run_default.py --bin BUILD/bin --work DIR [--quick] [--bundles DIR] [--min-gain X]

--quick: a shorter run (the CI test). --bundles: the kernel bundles of
examples/ (scripts/run.sh compiles them), used with a GPU. --min-gain: exit
1 unless the trained drafter's tau exceeds the untrained one's by X.
The target is reused while make_target.py, tasks.py and the settings are
unchanged; everything after it is redone each run."""
import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tasks  # noqa: E402

# What a run does: target training steps, training prompts (their answers
# are the drafter's data), held-out prompts, answer length, drafter epochs.
FULL = dict(target_steps=600, prompts=2000, heldout=24, max_new_tokens=128, drafter_epochs=6)
QUICK = dict(target_steps=250, prompts=600, heldout=12, max_new_tokens=96, drafter_epochs=8)


class Stages:
    def __init__(self):
        self.started = time.monotonic()

    def begin(self, what):
        print(f"\n== [{time.monotonic() - self.started:5.0f} s] {what}", flush=True)


def run(command, **kwargs):
    print("$ " + " ".join(command), flush=True)
    result = subprocess.run(command, **kwargs)
    if result.returncode != 0:
        sys.exit(f"run_default: {os.path.basename(command[0])} exited with status {result.returncode}")
    return result


def write_prompts(path, count, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(count):
            f.write(json.dumps(tasks.prompt(rng)) + "\n")


def fingerprint(settings):
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for name in ("make_target.py", "tasks.py"):
        with open(os.path.join(HERE, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def make_target(work, settings, device, stages):
    target = os.path.join(work, "target")
    stamp = os.path.join(work, "target.fingerprint")
    key = fingerprint({"steps": settings["target_steps"], "device": device})
    if os.path.isdir(target) and os.path.exists(stamp) and open(stamp).read() == key:
        stages.begin(f"the target: {target} (made by an earlier run with these settings)")
        return target
    stages.begin("the target: a tokenizer and a small Qwen3 model, trained on the chat tasks")
    run([sys.executable, os.path.join(HERE, "make_target.py"), "--out", target,
         "--steps", str(settings["target_steps"]), "--device", device])
    with open(stamp, "w") as f:
        f.write(key)
    return target


def evaluate(bin_dir, target, drafter, prompts, max_new_tokens, device, dtype, out):
    run([os.path.join(bin_dir, "dflex-eval"), "--target", target, "--drafter", drafter,
         "--prompts", prompts, "--max-new-tokens", str(max_new_tokens), "--device", device,
         "--dtype", dtype, "--out", out])
    with open(out) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="the build's bin directory")
    parser.add_argument("--work", required=True, help="where the target, data and run go")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--bundles", help="kernel bundles of examples/ (for a GPU)")
    parser.add_argument("--min-gain", type=float)
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    os.makedirs(args.work, exist_ok=True)
    work = os.path.abspath(args.work)
    stages = Stages()

    import torch
    # The target's training and answers need only PyTorch; the drafter needs
    # its kernels on the GPU.
    python_device = "cuda" if torch.cuda.is_available() else "cpu"
    bundle = os.path.join(args.bundles, "dflash") if args.bundles else None
    gpu = torch.cuda.is_available() and bundle is not None and os.path.isdir(bundle)
    device, dtype = ("cuda", "bfloat16") if gpu else ("cpu", "float32")
    print(f"run_default: the target on {python_device}, the drafter on {device}" +
          ("" if gpu or not torch.cuda.is_available() else " (no kernel bundles: --bundles)"), flush=True)

    target = make_target(work, settings, python_device, stages)

    stages.begin(f"data: the target answers {settings['prompts']} prompts (dflex-data regenerate)")
    prompts, heldout = os.path.join(work, "prompts.jsonl"), os.path.join(work, "heldout.jsonl")
    write_prompts(prompts, settings["prompts"], seed=1000)
    write_prompts(heldout, settings["heldout"], seed=2000)
    data = os.path.join(work, "data")
    # The prompts may have changed with the settings: a new journal.
    shutil.rmtree(data, ignore_errors=True)
    for stale in (data + ".journal.jsonl", data + ".journal.jsonl.settings.json"):
        if os.path.exists(stale):
            os.remove(stale)
    run([os.path.join(args.bin, "dflex-data"), "regenerate", "--target", target,
         "--max-new-tokens", str(settings["max_new_tokens"]), "--device", python_device, data, prompts])

    stages.begin("the drafter: dflex-train on the target's answers")
    from transformers import AutoTokenizer
    mask = AutoTokenizer.from_pretrained(target).convert_tokens_to_ids("<|mask|>")
    run_dir = os.path.join(work, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [f"target.dir={target}", f"target.dtype={dtype}", f"drafter.dtype={dtype}",
                 f"drafter.mask_token_id={mask}", f"data.path={data}", f"checkpoint.dir={run_dir}",
                 f"devices=[{device}]", f"train.epochs={settings['drafter_epochs']}"]
    if gpu:
        overrides += [f"kernels.drafter_bundle={bundle}", "kernels.drafter_full_spec=default_drafter_attention"]
    command = [os.path.join(args.bin, "dflex-train"), "--config", os.path.join(HERE, "train.yaml"),
               "--checkpoint-initial", "--plain"]
    for override in overrides:
        command += ["--set", override]
    run(command)
    untrained = os.path.join(run_dir, "step-00000000")
    with open(os.path.join(run_dir, "latest")) as f:
        trained = os.path.join(run_dir, f.read().strip())

    stages.begin(f"evaluation: speculative decoding of {settings['heldout']} held-out prompts (dflex-eval)")
    results = {}
    # In float32: then the target's cached decoding reproduces its uncached
    # greedy output exactly on the GPU too, and the lossless check is exact.
    for name, drafter in (("untrained", untrained), ("trained", trained)):
        results[name] = evaluate(args.bin, target, drafter, heldout, settings["max_new_tokens"], device,
                                 "float32", os.path.join(work, f"eval_{name}.json"))

    stages.begin("done")
    block = len(results["trained"]["accepted_at_least_k"]) + 1
    shown = min(block - 1, 8)
    print(f"| drafter on {device} | tau | " + " | ".join(f">= {k}" for k in range(1, shown + 1)) +
          " | lossless | speed-up |")
    print("|---|---|" + "---|" * shown + "---|---|")
    for name in ("untrained", "trained"):
        r = results[name]
        print(f"| {name} | {r['tau']:.2f} | " + " | ".join(f"{a:.2f}" for a in r["accepted_at_least_k"][:shown]) +
              f" | {'yes' if r['lossless'] else 'NO'} | {r['speedup']:.2f}x |")
    print(f"\ntau: accepted drafts + 1 per verification, averaged per response then over responses; "
          f">= k: share of verifications that kept at least k of the {block - 1} drafts; speed-up: decoding "
          "time of the target alone over speculative decoding's.")
    print(f"trained drafter (serving format): {trained}")
    plots = os.path.join(run_dir, "plots")
    if os.path.isdir(plots):
        print("plots: " + ", ".join(os.path.join(plots, p) for p in sorted(os.listdir(plots))
                                    if p.endswith(".png")))
    print(f"TensorBoard: tensorboard --logdir {os.path.join(run_dir, 'tensorboard')}")
    gain = results["trained"]["tau"] - results["untrained"]["tau"]
    if args.min_gain is not None and gain < args.min_gain:
        sys.exit(f"run_default: the trained drafter's tau gains {gain:.2f} over the untrained one's, "
                 f"less than {args.min_gain}")
    if not (results["trained"]["lossless"] and results["untrained"]["lossless"]):
        sys.exit("run_default: speculative decoding did not reproduce the target's greedy output")


if __name__ == "__main__":
    main()
