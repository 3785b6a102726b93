"""Reference checkpoints for the runtime's safetensors tests.

  write-single PATH      save the reference tensors with safetensors.torch
  write-sharded DIR      save them as two shards plus model.safetensors.index.json
  check PATH             load PATH (a file, an index, or a directory) with the
                         safetensors package and compare with the reference

The reference tensors are a pure function of their names, so the C++ test
builds the same ones.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

SPECS = {
    "embed.weight": (torch.bfloat16, (7, 5)),
    "layers.0.norm": (torch.float16, (5,)),
    "layers.0.proj": (torch.float32, (3, 4, 2)),
    "lengths": (torch.int32, (6,)),
    "offsets": (torch.int64, (4,)),
    "empty": (torch.float32, (0, 3)),
}


def reference():
    out = {}
    for name, (dtype, shape) in SPECS.items():
        count = 1
        for extent in shape:
            count *= extent
        index = torch.arange(count, dtype=torch.float64)
        if dtype in (torch.int32, torch.int64):
            scale = 10_000_000_000 if dtype == torch.int64 else 7
            values = torch.arange(count, dtype=torch.int64) * scale - 100
        else:
            values = index * 0.25 - 3.0
        out[name] = values.to(dtype).reshape(shape)
    return out


def load_any(path):
    if os.path.isdir(path):
        single = os.path.join(path, "model.safetensors")
        path = single if os.path.exists(single) else os.path.join(path, "model.safetensors.index.json")
    if not path.endswith(".json"):
        return load_file(path)
    with open(path) as f:
        index = json.load(f)
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        loaded = load_file(os.path.join(os.path.dirname(path), shard))
        for name, tensor in loaded.items():
            if index["weight_map"][name] != shard:
                raise SystemExit(f"{name} is in {shard} but the index says {index['weight_map'][name]}")
            tensors[name] = tensor
    return tensors


def main():
    mode, path = sys.argv[1], sys.argv[2]
    tensors = reference()
    if mode == "write-single":
        save_file(tensors, path, metadata={"format": "pt"})
    elif mode == "write-sharded":
        os.makedirs(path, exist_ok=True)
        names = sorted(tensors)
        shards = {"model-00001-of-00002.safetensors": names[:3],
                  "model-00002-of-00002.safetensors": names[3:]}
        weight_map = {}
        for shard, members in shards.items():
            save_file({n: tensors[n] for n in members}, os.path.join(path, shard), metadata={"format": "pt"})
            weight_map.update({n: shard for n in members})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 1234}, "weight_map": weight_map}, f, indent=2)
    elif mode == "check":
        loaded = load_any(path)
        if sorted(loaded) != sorted(tensors):
            raise SystemExit(f"names differ: {sorted(loaded)} vs {sorted(tensors)}")
        for name, expected in tensors.items():
            got = loaded[name]
            if got.dtype != expected.dtype or got.shape != expected.shape or not torch.equal(got, expected):
                raise SystemExit(f"{name}: got {got.dtype} {tuple(got.shape)} {got.flatten()[:4]}, "
                                 f"expected {expected.dtype} {tuple(expected.shape)} {expected.flatten()[:4]}")
        print(f"ok: {len(loaded)} tensors")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
