#!/usr/bin/env python3
"""What a mask's pair part costs per element, without a GPU.

usage: mask_pair_sass.py BUNDLE_DIR[,BUNDLE_DIR...] [--arch sm_90a]

For each bundle (dflex-compile output) and each attention spec in it, the
generated source gets one extra kernel that evaluates `mask_pair` for one
query row against 32 key columns read from memory, the loop a partial tile's
visibility runs per thread (or, for a variant with key intervals, the test
of 32 keys against one row's intervals, what the kernels whose rows are
fixed run instead: kernels/attention/variant.cuh); nvcc compiles it for the arch and cuobjdump
counts its SASS instructions and global loads. The instructions per pair
(loads of the column parts left out) are what the mask costs the kernels
at every element of a partial tile. Several comma-separated folders (the
same specs compiled by two builds of dflex-compile) are measured side by
side. Needs the CUDA toolkit's nvcc, and cuobjdump (the toolkit's, or the
one Triton ships).
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAIRS = 32
PAIR_KERNEL = """
__global__ void dflex_mask_pair_cost(const dflex_generated::Variant variant,
                                     const dflex_generated::Variant::MaskRow row,
                                     const dflex_generated::Variant::MaskColumn* columns, unsigned* out) {
  unsigned bits = 0;
#pragma unroll
  for (int i = 0; i < %d; ++i) bits |= unsigned(variant.mask_pair(row, columns[i])) << i;
  out[threadIdx.x] = bits;
}
""" % PAIRS
INTERVAL_KERNEL = """
__global__ void dflex_mask_pair_cost(const dflex_generated::Variant::KeyIntervals row, const int* columns,
                                     unsigned* out) {
  unsigned bits = 0;
#pragma unroll
  for (int i = 0; i < %d; ++i)
    bits |= unsigned(::dflex::kernels::in_key_intervals<dflex_generated::Variant>(row, columns[i])) << i;
  out[threadIdx.x] = bits;
}
""" % PAIRS


def cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton  # its NVIDIA backend ships the tool

        candidate = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.path.exists(candidate):
            return candidate
    except ImportError:
        pass
    sys.exit("mask_pair_sass: no cuobjdump (install the CUDA toolkit's, or Triton)")


def pair_cost(source, arch, tool, scratch):
    unit = os.path.join(scratch, "pair.cu")
    with open(source) as f, open(unit, "w") as out:
        text = f.read()
        out.write(text + (INTERVAL_KERNEL if "kKeyIntervals" in text else PAIR_KERNEL))
    cubin = os.path.join(scratch, "pair.cubin")
    subprocess.run(["nvcc", "-std=c++17", "-w", "-cubin", "-arch=" + arch, "-I" + os.path.join(ROOT, "kernels"),
                    "-I" + os.path.join(ROOT, "include"), unit, "-o", cubin], check=True)
    sass = subprocess.run([tool, "-sass", cubin], check=True, capture_output=True, text=True).stdout
    instructions = len(re.findall(r"^\s*/\*[0-9a-f]+\*/", sass, re.M))
    loads = len(re.findall(r"\bLDG\b", sass))
    return instructions, loads


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    arch = sys.argv[sys.argv.index("--arch") + 1] if "--arch" in sys.argv else "sm_90a"
    tool = cuobjdump()
    print(f"| bundle | spec | folder | SASS for {PAIRS} pairs | loads | instructions per pair |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        folders = sys.argv[1].split(",")
        specs = sorted({os.path.relpath(p, folders[0]) for p in glob.glob(os.path.join(folders[0], "*", "*.cu"))})
        for spec in specs:
            for folder in folders:
                source = os.path.join(folder, spec)
                if not os.path.exists(source):
                    continue
                with open(source) as f:
                    if "bool mask_pair(" not in f.read():
                        continue  # a gated-delta module
                instructions, loads = pair_cost(source, arch, tool, scratch)
                bundle, name = os.path.split(spec)
                print(f"| {bundle} | {name[:-3]} | {os.path.basename(os.path.normpath(folder))} | "
                      f"{instructions} | {loads} | {(instructions - loads) / PAIRS:.1f} |", flush=True)


if __name__ == "__main__":
    main()
