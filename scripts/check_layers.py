#!/usr/bin/env python3
"""Refuses includes that run from a lower layer to a higher one.

The layers come from the build (cmake/DFlexLayers.cmake): one line per layer,
"NAME HEADER_PREFIX SOURCE_DIRS BELOW", the last two comma-separated ("-"
for none). A file of a layer (under one of its source dirs, or a header under
its prefix) may include headers of its own layer and of the layers below it,
transitively. Exits 1 listing every file:line that breaks the order.
"""
import argparse
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_layers(path):
    layers = {}
    for line in pathlib.Path(path).read_text().splitlines():
        if not line.strip():
            continue
        name, prefix, dirs, below = (line.split(" ") + ["", "", ""])[:4]
        split = lambda text: [x for x in text.split(",") if x and x != "-"]
        layers[name] = {"prefix": prefix, "dirs": split(dirs), "below": split(below)}
    for name, layer in layers.items():
        for other in layer["below"]:
            if other not in layers:
                sys.exit(f"check_layers: layer {name} builds on unknown layer {other}")
    return layers


def reachable(layers, name):
    seen, stack = set(), [name]
    while stack:
        for other in layers[stack.pop()]["below"]:
            if other not in seen:
                seen.add(other)
                stack.append(other)
    if name in seen:
        sys.exit(f"check_layers: layer {name} builds on itself (a cycle)")
    return seen | {name}


def owner_of_header(layers, include):
    best = None
    for name, layer in layers.items():
        if include.startswith(layer["prefix"]) and (
                best is None or len(layer["prefix"]) > len(layers[best]["prefix"])):
            best = name
    return best


def files_of(root, layers, name):
    layer = layers[name]
    for directory in layer["dirs"]:
        for path in sorted((root / directory).rglob("*")):
            if path.suffix in (".cpp", ".h", ".def") and path.is_file():
                yield path
    for base in (root / "include", root / "runtime" / "include"):
        header_dir = base / layer["prefix"]
        if header_dir.is_dir():
            for path in sorted(header_dir.rglob("*")):
                if path.suffix in (".h", ".def") and path.is_file():
                    yield path


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True, type=pathlib.Path)
    parser.add_argument("--layers", required=True)
    args = parser.parse_args()
    layers = read_layers(args.layers)
    problems = []
    for name in sorted(layers):
        allowed = reachable(layers, name)
        for path in files_of(args.root, layers, name):
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                target = owner_of_header(layers, match.group(1))
                if target is not None and target not in allowed:
                    problems.append(f"{path.relative_to(args.root)}:{number}: layer {name} "
                                    f"includes {match.group(1)} of layer {target}, which is "
                                    f"not below it (it builds on: "
                                    f"{', '.join(sorted(allowed - {name})) or 'nothing'})")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
