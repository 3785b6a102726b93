#!/usr/bin/env python3
"""dflex-compile end to end: bundles, cache hits, faults, concurrency.

usage: dflex_compile_bundles.py DFLEX_COMPILE EXAMPLES_DIR

- every example compiles for the default archs (sm_90a and sm_120) into a bundle with
  cubins for both; each arch's binary has exactly its kernels: the portable ones
  everywhere, the Hopper (wgmma) ones only in sm_90a (a forward for head_dim 64, 128
  and 256, a backward for 64 and 128), with their launch constants, each kernel in its part (one NVRTC
  program, PTX and cubin per pass and family: wgmma in the Hopper parts only);
- each binary carries the launch constants of its own PTX: the portable kernels' are
  the default configs of that arch's compute capability (sm_120's own, within its
  101,376 B of shared memory per block; sm_90a's those of sm_90), the Hopper kernels'
  only where they are;
- without sm_90a (sm_90 + sm_120) the bundle has no Hopper kernels or constants; a
  compute_90a (PTX only) target has them;
- --portable-configs-of sm_120 gives the sm_90a binary sm_120's portable tiles, their
  shared memory padded to sm_120's blocks per multiprocessor (its Hopper kernels
  unchanged); an arch without configs of its own is refused; --portable-forward-config and
  --portable-backward-config replace the configs outright (a candidate's launch constants in every
  binary, NVRTC's compile of it), and malformed ones are refused with the option named;
- sm_120's kernels do not spill (ptxas's report in the manifest), except where a budget below
  records what a kernel is known to spill, and the attention kernels' static shared memory (staged
  mask parts) never costs an sm_120 SM one of their blocks;
- a second compile is all cache hits, at least 10x faster, and byte-identical;
- a truncated, flipped, wrongly keyed or empty cache entry is quarantined with a
  warning and rebuilt, and the bundle stays identical;
- an unusable cache directory gives a warning and an uncached, identical bundle;
- 8 concurrent compiles on one empty cache compile once and agree byte for byte,
  leaving no partial files behind.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SUMMARY = re.compile(r"cache (\d+)/(\d+) hits")
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL", message)


DEFAULT_ARCHS = ["sm_90a", "sm_120"]
PORTABLE_ROLES = {"attention_forward", "attention_backward_preprocess", "attention_backward",
                  "attention_backward_grad_q", "tile_classify"}
SM90_FORWARD_ROLES = {"attention_forward_sm90"}
SM90_BACKWARD_ROLES = {"attention_backward_preprocess_sm90", "attention_backward_sm90",
                       "attention_backward_grad_q_sm90"}
# The part of a binary (its own NVRTC program, PTX and cubin) that holds each kernel.
PART_OF = {"attention_forward": "forward", "tile_classify": "forward",
           "attention_backward_preprocess": "backward", "attention_backward": "backward",
           "attention_backward_grad_q": "backward", "attention_forward_sm90": "forward_sm90",
           **{role: "backward_sm90" for role in SM90_BACKWARD_ROLES}}
GATED_DELTA_PARTS = {"gated_delta_forward", "gated_delta_backward"}
# Launch constants of the Hopper kernels (docs/kernels.md): threads, dynamic shared
# bytes, tiles.
SM90_FORWARD_LAUNCH = {64: {"threads": 384, "shared_bytes": 83016, "block_m": 128, "block_n": 128},
                       128: {"threads": 384, "shared_bytes": 164936, "block_m": 128, "block_n": 128},
                       256: {"threads": 384, "shared_bytes": 197704, "block_m": 128, "block_n": 64}}
SM90_BACKWARD_LAUNCH = {64: {"threads": 384, "shared_bytes": 165928, "block_m": 64, "block_n": 128,
                             "row_kernel_threads": 256, "row_kernel_rows": 8},
                        128: {"threads": 384, "shared_bytes": 231464, "block_m": 64, "block_n": 128,
                              "row_kernel_threads": 256, "row_kernel_rows": 8}}
# The portable kernels' launch constants per head dim and compute capability
# (DefaultAttentionConfigs, kernels/attention/config.cuh): sm_120 forwards keep 16
# query rows per warp, sm_90 ones 32 where registers allow; one backward for both.
SM120_SHARED_BYTES_PER_BLOCK = 101376
PORTABLE_FORWARD_LAUNCH = {
    (64, 90): {"threads": 128, "shared_bytes": 32768, "block_m": 128, "block_n": 64},
    (64, 120): {"threads": 128, "shared_bytes": 49152, "block_m": 64, "block_n": 128},
    (128, 90): {"threads": 128, "shared_bytes": 65536, "block_m": 128, "block_n": 64},
    (128, 120): {"threads": 128, "shared_bytes": 49152, "block_m": 64, "block_n": 64},
    (256, 90): {"threads": 128, "shared_bytes": 98304, "block_m": 64, "block_n": 64},
    (256, 120): {"threads": 128, "shared_bytes": 49152, "block_m": 64, "block_n": 32}}
PORTABLE_BACKWARD_LAUNCH = {
    64: {"threads": 128, "shared_bytes": 49664, "block_m": 64, "block_n": 64, "row_kernel_threads": 256,
         "row_kernel_rows": 8},
    128: {"threads": 256, "shared_bytes": 82432, "block_m": 64, "block_n": 64, "row_kernel_threads": 256,
          "row_kernel_rows": 8},
    256: {"threads": 128, "shared_bytes": 69888, "block_m": 32, "block_n": 32, "row_kernel_threads": 256,
          "row_kernel_rows": 8}}
# sm_120's configs are chosen to compile without spills; the kernels that do spill on
# sm_120, by module ("*": any) and role, with their bytes of spill stores. More is a regression.
SM120_SPILL_BUDGETS = {
    ("softcap_attention", "attention_forward"): 8,  # head_dim 256 with tanh (docs/kernels.md, Configs)
    ("*", "gated_delta_backward_chunk"): 32,  # at 255 registers (docs/gated-delta.md)
}

# The launch constants of each portable main kernel's role.
MAIN_KERNEL_LAUNCH = {"attention_forward": "dflex_forward_launch", "attention_backward": "dflex_backward_launch"}

# Shared memory per multiprocessor of sm_90 and sm_120; 1 KB of it is reserved per block.
SHARED_BYTES_PER_SM = {90: 233472, 120: 102400}


def at_sm120_occupancy(launch, arch):
    """`launch` with its shared memory padded so that a multiprocessor of `arch` holds as
    many of its blocks as an sm_120 one (sm_120's own binary: unchanged)."""
    per_sm = SHARED_BYTES_PER_SM[compute_capability(arch)]
    if per_sm == SHARED_BYTES_PER_SM[120]:
        return launch
    blocks = max(1, SHARED_BYTES_PER_SM[120] // (launch["shared_bytes"] + 1024))
    # The least multiple of 128 bytes with which blocks + 1 no longer fit.
    least = -(-(per_sm // (blocks + 1) - 1024 + 1) // 128) * 128
    return dict(launch, shared_bytes=max(launch["shared_bytes"], least))


def compile_bundle(tool, source, out, cache, archs=()):
    """Compiles with the given archs, or dflex-compile's defaults."""
    args = [tool, source, "-o", out, "--cache-dir", cache]
    for arch in archs:
        args += ["--arch", arch]
    start = time.monotonic()
    run = subprocess.run(args, capture_output=True, text=True, timeout=600)
    return run, time.monotonic() - start


def hits(run):
    match = SUMMARY.search(run.stdout)
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def bundle_files(directory):
    files = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            files[name] = f.read()
    return files


def expected_roles(arch, head_dim):
    """The kernel roles a binary for `arch` must have for a spec of `head_dim`."""
    if arch not in ("sm_90a", "compute_90a"):
        return PORTABLE_ROLES
    return (PORTABLE_ROLES | (SM90_FORWARD_ROLES if head_dim in (64, 128, 256) else set())
            | (SM90_BACKWARD_ROLES if head_dim in (64, 128) else set()))


def compute_capability(arch):
    """90 for sm_90, sm_90a and compute_90a; 120 for sm_120."""
    return int(arch.split("_")[1].rstrip("a"))


def check_launch(launch, arch, roles, head_dim, label):
    """The launch constants of one attention binary: its own arch's configs."""
    forward, backward = launch.get("dflex_forward_launch"), launch.get("dflex_backward_launch")
    expected_forward = PORTABLE_FORWARD_LAUNCH[(head_dim, compute_capability(arch))]
    check(forward == expected_forward, f"{label}: {arch} forward {forward}, expected {expected_forward}")
    check(backward == PORTABLE_BACKWARD_LAUNCH[head_dim],
          f"{label}: {arch} backward {backward}, expected {PORTABLE_BACKWARD_LAUNCH[head_dim]}")
    if compute_capability(arch) >= 120:
        for pass_launch in (forward, backward):
            check(pass_launch is not None and pass_launch["shared_bytes"] <= SM120_SHARED_BYTES_PER_BLOCK,
                  f"{label}: {arch} launch {pass_launch} exceeds sm_120's shared memory")
    for symbol, role_set, expected in (
            ("dflex_forward_sm90_launch", SM90_FORWARD_ROLES, SM90_FORWARD_LAUNCH),
            ("dflex_backward_sm90_launch", SM90_BACKWARD_ROLES, SM90_BACKWARD_LAUNCH)):
        if role_set <= roles:
            check(launch.get(symbol) == expected.get(head_dim),
                  f"{label}: {arch} {symbol} {launch.get(symbol)}, expected {expected.get(head_dim)}")
        else:
            check(symbol not in launch and not role_set & roles,
                  f"{label}: {arch} has {symbol} or its kernels without the whole set")


def check_bundle(directory, label, archs=DEFAULT_ARCHS):
    manifest = json.loads(open(os.path.join(directory, "manifest.json")).read())
    check(manifest["archs"] == archs, f"{label}: archs {manifest['archs']}")
    check(manifest["format_version"] == 3, f"{label}: format_version {manifest['format_version']}")
    for module in manifest["modules"]:
        check("launch" not in module, f"{label}: {module['name']} has module-wide launch constants")
        for arch in archs:
            binary = module["binaries"].get(arch)
            check(binary is not None, f"{label}: no {arch} binary for {module['name']}")
            if not binary:
                continue
            # Each part: its PTX for the arch, its cubin, wgmma exactly in the Hopper parts.
            parts = binary.get("parts", {})
            for part, files in parts.items():
                where = f"{label}: {module['name']} {arch} {part}"
                ptx = open(os.path.join(directory, files["ptx"]), encoding="utf-8").read()
                check(f".target {arch.replace('compute_', 'sm_')}" in ptx, f"{where}: PTX target")
                check(("wgmma.mma_async" in ptx) == part.endswith("_sm90"),
                      f"{where}: wgmma in the PTX of {'no' if part.endswith('_sm90') else 'a'} Hopper part")
                if arch.startswith("sm_"):
                    cubin = open(os.path.join(directory, files["cubin"]), "rb").read()
                    check(cubin[:4] == b"\x7fELF", f"{where}: cubin is not ELF")
                    check(hashlib.sha256(cubin).hexdigest() == files["cubin_sha256"], f"{where}: cubin digest")
            if module["kind"] != "attention":
                check(set(parts) == GATED_DELTA_PARTS, f"{label}: {arch} gated-delta parts {sorted(parts)}")
                check("dflex_gated_delta_launch" in binary.get("launch", {}),
                      f"{label}: {arch} binary of {module['name']} has no launch constants")
                continue
            # Exactly the kernels this arch builds, each with its lowered name, in their parts.
            head_dim = module["spec"]["qk_head_dim"]
            roles = {k["role"] for k in module["kernels"] if arch in k["archs"]}
            check(roles == expected_roles(arch, head_dim),
                  f"{label}: {arch} has kernels {sorted(roles)}, expected "
                  f"{sorted(expected_roles(arch, head_dim))}")
            check(set(parts) == {PART_OF[role] for role in roles},
                  f"{label}: {arch} has parts {sorted(parts)} for kernels {sorted(roles)}")
            check_launch(binary.get("launch", {}), arch, roles, head_dim, f"{label}: {module['name']}")
        for kernel in module["kernels"]:
            hopper = kernel["role"].endswith("_sm90")
            check(kernel.get("required_target") == ("sm_90a" if hopper else None),
                  f"{label}: {kernel['role']} required_target {kernel.get('required_target')}")
            if not hopper:
                check(sorted(kernel["archs"]) == sorted(archs),
                      f"{label}: {kernel['role']} is in {sorted(kernel['archs'])}, not every arch")
            for arch, entry in kernel["archs"].items():
                check(entry["lowered_name"].startswith("_Z"),
                      f"{label}: {kernel['role']} has no lowered name on {arch}")
                if compute_capability(arch) == 120:
                    spilled = entry["resources"]["spill_store_bytes"]
                    budget = max(SM120_SPILL_BUDGETS.get((module["name"], kernel["role"]), 0),
                                 SM120_SPILL_BUDGETS.get(("*", kernel["role"]), 0))
                    check(spilled <= budget, f"{label}: {module['name']} {kernel['role']} spills {spilled} B "
                                             f"on {arch}, more than its {budget} B")
                    launch = module["binaries"][arch]["launch"].get(MAIN_KERNEL_LAUNCH.get(kernel["role"]))
                    if launch:
                        static = entry["resources"]["static_shared_bytes"]
                        per_block = launch["shared_bytes"] + 1024
                        blocks = SHARED_BYTES_PER_SM[120] // per_block
                        check(SHARED_BYTES_PER_SM[120] // (per_block + static) == blocks,
                              f"{label}: {module['name']} {kernel['role']}'s {static} B of static shared memory "
                              f"leave an sm_120 SM {SHARED_BYTES_PER_SM[120] // (per_block + static)} of its "
                              f"{blocks} blocks")
    return manifest


def stray_files(cache):
    """Anything in the cache but entries, quarantined entries and the lock folder."""
    stray = []
    for root, _, names in os.walk(cache):
        for name in names:
            if not (name.endswith(".entry") or "quarantine" in root or name.endswith(".lock")):
                stray.append(os.path.join(root, name))
    return stray


def main():
    tool, examples = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="dflex-compile-test-")
    try:
        cache = os.path.join(work, "cache")
        sources = sorted(os.path.join(examples, f) for f in os.listdir(examples) if f.endswith(".mlir"))

        # Cold, then warm.
        cold_total = warm_total = 0.0
        reference = {}
        for source in sources:
            name = os.path.basename(source)[:-5]
            run, seconds = compile_bundle(tool, source, os.path.join(work, "cold", name), cache)
            check(run.returncode == 0, f"{name}: cold compile failed: {run.stderr}")
            if run.returncode:
                continue
            cold_total += seconds
            check_bundle(os.path.join(work, "cold", name), name)
            reference[name] = bundle_files(os.path.join(work, "cold", name))
        for source in sources:
            name = os.path.basename(source)[:-5]
            if name not in reference:
                continue
            run, seconds = compile_bundle(tool, source, os.path.join(work, "warm", name), cache)
            warm_total += seconds
            hit, total = hits(run)
            check(run.returncode == 0 and hit == total, f"{name}: warm compile not all hits: {run.stdout}")
            check(bundle_files(os.path.join(work, "warm", name)) == reference[name],
                  f"{name}: warm bundle differs")
        print(f"cold {cold_total:.2f} s, warm {warm_total:.2f} s, speed-up {cold_total / warm_total:.0f}x")
        check(cold_total >= 10 * warm_total, "warm compiles are not 10x faster")

        # Without sm_90a no Hopper kernel is built or listed; compute_90a (PTX only) has them.
        source = os.path.join(examples, "dflash.mlir")
        for archs in (["sm_90", "sm_120"], ["compute_90a"]):
            out = os.path.join(work, "archs-" + "-".join(archs))
            run, _ = compile_bundle(tool, source, out, cache, archs)
            check(run.returncode == 0, f"dflash for {archs}: compile failed: {run.stderr}")
            if run.returncode == 0:
                check_bundle(out, f"dflash for {archs}", archs)

        # --portable-configs-of sm_120: every binary's portable kernels take sm_120's tiles, at
        # sm_120's blocks per multiprocessor (an sm_90 GPU then measures what sm_120 runs); the
        # Hopper kernels keep theirs. An arch without its own configs is refused.
        out = os.path.join(work, "sm120-configs")
        run = subprocess.run([tool, source, "-o", out, "--cache-dir", cache, "--portable-configs-of", "sm_120"],
                             capture_output=True, text=True, timeout=600)
        check(run.returncode == 0, f"dflash with sm_120's configs: compile failed: {run.stderr}")
        if run.returncode == 0:
            manifest = json.load(open(os.path.join(out, "manifest.json")))
            for module in (m for m in manifest["modules"] if m["kind"] == "attention"):
                head_dim = module["spec"]["qk_head_dim"]
                for arch in DEFAULT_ARCHS:
                    launch = module["binaries"][arch]["launch"]
                    where = f"sm_120's configs: {module['name']} {arch}"
                    forward = at_sm120_occupancy(PORTABLE_FORWARD_LAUNCH[(head_dim, 120)], arch)
                    backward = at_sm120_occupancy(PORTABLE_BACKWARD_LAUNCH[head_dim], arch)
                    check(launch.get("dflex_forward_launch") == forward,
                          f"{where}: forward {launch.get('dflex_forward_launch')}, expected {forward}")
                    check(launch.get("dflex_backward_launch") == backward,
                          f"{where}: backward {launch.get('dflex_backward_launch')}, expected {backward}")
                check(module["binaries"]["sm_90a"]["launch"].get("dflex_forward_sm90_launch")
                      == SM90_FORWARD_LAUNCH[head_dim], f"sm_120's configs: {module['name']} Hopper forward")
        # A candidate chosen outright: 128 x 64 over 8 warps with early K, a 4-warp chunk-32 backward.
        out = os.path.join(work, "chosen-configs")
        run = subprocess.run([tool, source, "-o", out, "--cache-dir", cache, "--portable-configs-of", "sm_120",
                              "--portable-forward-config", "128,64,8,early_key",
                              "--portable-backward-config", "64,64,4,32"], capture_output=True, text=True, timeout=600)
        check(run.returncode == 0, f"dflash with chosen configs: compile failed: {run.stderr}")
        if run.returncode == 0:
            manifest = json.load(open(os.path.join(out, "manifest.json")))
            module = next(m for m in manifest["modules"] if m["name"] == "drafter_attention")
            for arch in DEFAULT_ARCHS:
                launch = module["binaries"][arch]["launch"]
                # Q (32 KB), K and V (16 KB each), padded to sm_120's one block per SM on sm_90a.
                forward = at_sm120_occupancy({"threads": 256, "shared_bytes": 65536, "block_m": 128,
                                              "block_n": 64}, arch)
                check(launch.get("dflex_forward_launch") == forward,
                      f"chosen configs: {arch} forward {launch.get('dflex_forward_launch')}, expected {forward}")
                backward = launch.get("dflex_backward_launch", {})
                check((backward.get("threads"), backward.get("block_m"), backward.get("block_n")) == (128, 64, 64),
                      f"chosen configs: {arch} backward {backward}")
        for option, value, complaint in (("--portable-forward-config", "128,64", "expected M,N,WARPS[,PIPELINE]"),
                                         ("--portable-forward-config", "128,64,8,fast", "unknown pipeline 'fast'"),
                                         ("--portable-backward-config", "64,64,4", "expected M,N,WARPS,DQ_CHUNK")):
            run = subprocess.run([tool, source, "-o", os.path.join(work, "bad-configs"), "--cache-dir", cache,
                                  option, value], capture_output=True, text=True, timeout=600)
            check(run.returncode != 0 and option in run.stderr and complaint in run.stderr,
                  f"{option} {value} was not refused by name: {run.returncode} {run.stderr}")
        run = subprocess.run([tool, source, "-o", os.path.join(work, "sm999-configs"), "--cache-dir", cache,
                              "--portable-configs-of", "sm_999"], capture_output=True, text=True, timeout=600)
        check(run.returncode != 0 and "--portable-configs-of 'sm_999'" in run.stderr,
              f"--portable-configs-of sm_999 was not refused: {run.returncode} {run.stderr}")

        # Faults in the cache entries of one example.
        entries_dir = next(root for root, _, names in os.walk(cache) if root.endswith("entries"))

        def entries():
            runs, _ = compile_bundle(tool, source, os.path.join(work, "probe"), cache)
            manifest = json.load(open(os.path.join(work, "probe", "manifest.json")))
            keys = [part["cache_key"] for b in manifest["modules"][0]["binaries"].values()
                    for part in b["parts"].values()]
            return [os.path.join(entries_dir, key + ".entry") for key in keys]

        def truncate(path):
            data = open(path, "rb").read()
            open(path, "wb").write(data[: len(data) // 2])

        def flip(path):
            data = bytearray(open(path, "rb").read())
            data[len(data) // 3] ^= 0x40
            open(path, "wb").write(bytes(data))

        def wrong_key(path):
            other = [p for p in entries() if p != path][0]
            shutil.copyfile(other, path)

        def empty(path):
            open(path, "wb").close()

        for fault in (truncate, flip, wrong_key, empty):
            target = entries()[0]
            fault(target)
            out = os.path.join(work, "fault-" + fault.__name__)
            run, _ = compile_bundle(tool, source, out, cache)
            check(run.returncode == 0, f"{fault.__name__}: compile failed: {run.stderr}")
            check("warning" in run.stderr, f"{fault.__name__}: no warning: {run.stderr}")
            if run.returncode == 0:
                check(bundle_files(out) == reference["dflash"], f"{fault.__name__}: bundle differs")
            again, _ = compile_bundle(tool, source, out, cache)
            hit, total = hits(again)
            check(hit == total and "warning" not in again.stderr,
                  f"{fault.__name__}: entry not rebuilt: {again.stdout} {again.stderr}")
        check(not stray_files(cache), f"stray files in the cache: {stray_files(cache)}")

        # An unusable cache directory: below a regular file.
        blocker = os.path.join(work, "not-a-directory")
        open(blocker, "w").close()
        out = os.path.join(work, "uncached")
        run, _ = compile_bundle(tool, source, out, os.path.join(blocker, "cache"))
        check(run.returncode == 0 and "warning" in run.stderr,
              f"unusable cache: {run.returncode} {run.stderr}")
        if run.returncode == 0:
            check(bundle_files(out) == reference["dflash"], "uncached bundle differs")

        # Eight concurrent compiles on one empty cache.
        shared = os.path.join(work, "shared-cache")
        processes = []
        for i in range(8):
            args = [tool, source, "-o", os.path.join(work, f"concurrent-{i}"), "--cache-dir", shared]
            processes.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        misses, entries_per_run = 0, 0
        for i, process in enumerate(processes):
            stdout, stderr = process.communicate(timeout=600)
            check(process.returncode == 0, f"concurrent {i} failed: {stderr}")
            match = SUMMARY.search(stdout)
            if match:
                misses += int(match.group(2)) - int(match.group(1))
                entries_per_run = int(match.group(2))
            check(bundle_files(os.path.join(work, f"concurrent-{i}")) == reference["dflash"],
                  f"concurrent {i}: bundle differs")
        check(misses == entries_per_run > 0,
              f"concurrent compiles built {misses} programs, expected {entries_per_run} (each part of each binary once)")
        check(not stray_files(shared), f"stray files in the shared cache: {stray_files(shared)}")
        leftovers = [n for n in os.listdir(work) if ".partial-" in n or ".old-" in n]
        check(not leftovers, f"partial bundles left behind: {leftovers}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
