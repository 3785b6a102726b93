#!/usr/bin/env python3
"""dflex-compile end to end: bundles, cache hits, faults, concurrency.

usage: dflex_compile_bundles.py DFLEX_COMPILE EXAMPLES_DIR

- every example compiles for sm_90 and sm_120 into a bundle with cubins for both;
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


def compile_bundle(tool, source, out, cache, archs=("sm_90", "sm_120")):
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


def check_bundle(directory, label):
    manifest = json.loads(open(os.path.join(directory, "manifest.json")).read())
    check(manifest["archs"] == ["sm_90", "sm_120"], f"{label}: archs {manifest['archs']}")
    for module in manifest["modules"]:
        for arch in ("sm_90", "sm_120"):
            binary = module["binaries"].get(arch)
            check(binary is not None, f"{label}: no {arch} binary for {module['name']}")
            if not binary:
                continue
            cubin = open(os.path.join(directory, binary["cubin"]), "rb").read()
            check(cubin[:4] == b"\x7fELF", f"{label}: {arch} cubin is not ELF")
            check(hashlib.sha256(cubin).hexdigest() == binary["cubin_sha256"],
                  f"{label}: {arch} cubin digest")
            ptx = open(os.path.join(directory, binary["ptx"]), encoding="utf-8").read()
            check(f".target {arch}" in ptx, f"{label}: {arch} PTX target")
        for kernel in module["kernels"]:
            for arch in ("sm_90", "sm_120"):
                check(kernel["archs"][arch]["lowered_name"].startswith("_Z"),
                      f"{label}: {kernel['role']} has no lowered name on {arch}")
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

        # Faults in the cache entries of one example.
        source = os.path.join(examples, "dflash.mlir")
        entries_dir = next(root for root, _, names in os.walk(cache) if root.endswith("entries"))

        def entries():
            runs, _ = compile_bundle(tool, source, os.path.join(work, "probe"), cache)
            manifest = json.load(open(os.path.join(work, "probe", "manifest.json")))
            keys = [b["cache_key"] for b in manifest["modules"][0]["binaries"].values()]
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
            args = [tool, source, "-o", os.path.join(work, f"concurrent-{i}"), "--cache-dir", shared,
                    "--arch", "sm_90", "--arch", "sm_120"]
            processes.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        misses = 0
        for i, process in enumerate(processes):
            stdout, stderr = process.communicate(timeout=600)
            check(process.returncode == 0, f"concurrent {i} failed: {stderr}")
            match = SUMMARY.search(stdout)
            if match:
                misses += int(match.group(2)) - int(match.group(1))
            check(bundle_files(os.path.join(work, f"concurrent-{i}")) == reference["dflash"],
                  f"concurrent {i}: bundle differs")
        check(misses == 2, f"concurrent compiles built {misses} binaries, expected 2 (one per arch)")
        check(not stray_files(shared), f"stray files in the shared cache: {stray_files(shared)}")
        leftovers = [n for n in os.listdir(work) if ".partial-" in n or ".old-" in n]
        check(not leftovers, f"partial bundles left behind: {leftovers}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
