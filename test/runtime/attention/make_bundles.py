"""Compiles the example attention specs into kernel bundles, one per file:

  make_bundles.py --compiler DFLEX_COMPILE --examples DIR --output DIR
                  [--arch ARCH ...] [--only NAME ...] [--cache-dir DIR]

writes OUTPUT/<example name>/ for every examples/*.mlir holding a
dflex.attention spec (or only the named ones).
"""
import argparse
import pathlib
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compiler", required=True)
    parser.add_argument("--examples", required=True, type=pathlib.Path)
    parser.add_argument("--output", required=True, type=pathlib.Path)
    parser.add_argument("--arch", action="append", default=[])
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--cache-dir")
    args = parser.parse_args()

    sources = [path for path in sorted(args.examples.glob("*.mlir"))
               if "dflex.attention" in path.read_text()]
    if args.only:
        sources = [path for path in sources if path.stem in args.only]
        missing = set(args.only) - {path.stem for path in sources}
        if missing:
            sys.exit(f"make_bundles: no attention example named {', '.join(sorted(missing))}")
    if not sources:
        sys.exit(f"make_bundles: no attention examples in {args.examples}")
    args.output.mkdir(parents=True, exist_ok=True)
    for source in sources:
        command = [args.compiler, str(source), "-o", str(args.output / source.stem), "--quiet"]
        command += [f"--arch={arch}" for arch in args.arch]
        if args.cache_dir:
            command.append(f"--cache-dir={args.cache_dir}")
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"make_bundles: {' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    print(f"make_bundles: {len(sources)} bundles in {args.output}")


if __name__ == "__main__":
    main()
