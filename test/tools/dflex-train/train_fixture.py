"""What the dflex-train tests share: a tiny Qwen3 target (target_reference.py, random weights),
learnable tokenized samples (arithmetic progressions) and a config for them on the CPU."""
import json
import os
import random
import subprocess
import sys


def check(condition, message):
    if not condition:
        sys.exit("dflex-train test: " + message)


def make_run(work, target_reference, samples=40, seed=0):
    """Writes the target under work/model, data.jsonl and train.yaml; returns the config's path."""
    subprocess.run([sys.executable, target_reference, "--model", "qwen3", "--out", work], check=True,
                   capture_output=True)
    data = os.path.join(work, "data.jsonl")
    rng = random.Random(seed)
    with open(data, "w") as f:
        for _ in range(samples):
            start, stride, length = rng.randrange(400), rng.randrange(1, 4), rng.randrange(12, 40)
            ids = [(start + stride * i) % 500 for i in range(length)]
            f.write(json.dumps({"input_ids": ids, "loss_mask": [int(i >= 2) for i in range(length)]}) + "\n")
    config = os.path.join(work, "train.yaml")
    with open(config, "w") as f:
        f.write(f"""target:
  dir: {work}/model
  dtype: float32
drafter:
  num_layers: 2
  layer_types: [full_attention, sliding_attention]
  sliding_window: 8
  intermediate_size: 96
  target_layer_ids: [0, 1]
  block_size: 4
  mask_token_id: 511
  dtype: float32
data:
  path: {data}
  token_budget: 64
  max_anchors: 8
log:
  interval: 1
""")
    return config


def losses(run_dir):
    return [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def latest_state(run_dir):
    name = open(os.path.join(run_dir, "latest")).read().strip()
    return json.load(open(os.path.join(run_dir, name, "trainer_state.json")))
