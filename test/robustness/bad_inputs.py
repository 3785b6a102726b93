#!/usr/bin/env python3
"""Bad input never crashes a dflex tool.

Feeds binary junk, invalid UTF-8, truncated files, deep nesting, very long
lines and thousands of random mutations of the shipped examples to a tool
(dflex-opt by default) and checks that each run ends by itself within the
time limit, without a signal, with exit status 0 (the mutation happened to
be valid) or 1 with a diagnostic located as file:line:col.

usage: bad_inputs.py TOOL EXAMPLES_DIR [--mutations N] [--seed S] [--tool-arg ARG ...]
"""

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

TIMEOUT_S = 20
LOCATED = re.compile(r"^[^\s:][^:]*:\d+:\d+: error: ", re.MULTILINE)


def generated_inputs(examples, rng, mutations):
    """Yields (name, bytes) pairs of bad inputs."""
    yield "binary-junk", bytes(rng.getrandbits(8) for _ in range(4096))
    yield "nul-bytes", b"\x00" * 64 + examples[0][1]
    yield "invalid-utf8", b"dflex.mask @m\xff\xfe(%b: index) {\n\xc3\x28 }\n"
    yield "invalid-utf8-in-string", b'dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) attributes {s = "\xff\xfe"} {\n}\n'
    yield "deep-brackets", b"dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) attributes {a = " + b"[" * 200000 + b"]" * 200000 + b"} {\n}\n"
    yield "deep-types", b"%0 = \"x.y\"() : () -> " + b"tensor<" * 100000 + b"i32" + b">" * 100000 + b"\n"
    yield "deep-regions", b'"x.y"() (' + b'{"x.y"() (' * 50000 + b"{}" + b') : () -> ()}' * 50000 + b") : () -> ()\n"
    yield "unclosed-deep", b"(" * 300000
    yield "long-line", b"dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) {\n  %c = arith.constant " + b"9" * 2000000 + b" : index\n}\n"
    yield "long-identifier", b"dflex.mask @" + b"a" * 2000000 + b"(%b: index, %h: index, %q: index, %kv: index) {\n}\n"
    yield "long-string", b'dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) attributes {s = "' + b"x" * 2000000 + b'"} {\n}\n'
    for name, text in examples:
        for cut in sorted(rng.sample(range(1, len(text)), min(12, len(text) - 1))):
            yield f"truncated-{name}-{cut}", text[:cut]
    tokens = [b"(", b")", b"{", b"}", b"[", b"]", b"<", b">", b":", b",", b"=", b"%", b"@",
              b"index", b"i1", b"f32", b"tensor<?xi32>", b"dflex.yield", b"dflex.read",
              b"dflex.call", b"arith.addi", b"arith.cmpi", b"-1", b"0", b"999999999999999999999",
              b"captures", b"padding", b"\n", b'"', b"//", b"dflex.mask", b"dflex.attention",
              b"heads(0, 0)", b"head_dim(1, 1)", b"#", b"!", b"^bb1:", b"\xff"]
    for n in range(mutations):
        name, text = examples[n % len(examples)]
        data = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            pos = rng.randrange(len(data) + 1)
            if op == 0 and data:          # delete a span
                del data[pos:pos + rng.randint(1, 16)]
            elif op == 1:                 # insert a token
                data[pos:pos] = rng.choice(tokens)
            elif op == 2 and data:        # replace a byte
                data[min(pos, len(data) - 1)] = rng.getrandbits(8)
            else:                         # duplicate a span
                span = bytes(data[pos:pos + rng.randint(1, 64)])
                data[pos:pos] = span
        yield f"mutation-{name}-{n}", bytes(data)


def check(tool, tool_args, workdir, item):
    name, data = item
    path = os.path.join(workdir, name + ".mlir")
    with open(path, "wb") as f:
        f.write(data)
    try:
        run = subprocess.run([tool, path, "-o", os.devnull] + tool_args,
                             capture_output=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{name}: no answer within {TIMEOUT_S} s"
    finally:
        pass
    stderr = run.stderr.decode("utf-8", "replace")
    os.unlink(path)
    if run.returncode < 0:
        return f"{name}: killed by signal {-run.returncode}\n{stderr[:2000]}"
    if run.returncode == 0:
        return None
    if run.returncode != 1:
        return f"{name}: exit status {run.returncode}\n{stderr[:2000]}"
    if not LOCATED.search(stderr):
        return f"{name}: no file:line:col diagnostic\n{stderr[:2000]}"
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("tool")
    parser.add_argument("examples")
    parser.add_argument("--mutations", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--tool-arg", dest="tool_args", action="append", default=[],
                        help="extra argument for the tool (repeatable)")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    examples = []
    for entry in sorted(os.listdir(args.examples)):
        if entry.endswith(".mlir"):
            with open(os.path.join(args.examples, entry), "rb") as f:
                examples.append((entry[:-5], f.read()))
    if not examples:
        sys.exit(f"no examples in {args.examples}")

    failures, total, valid = [], 0, 0
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for result in pool.map(lambda item: check(args.tool, args.tool_args, workdir, item),
                               generated_inputs(examples, rng, args.mutations)):
            total += 1
            if result:
                failures.append(result)
    for failure in failures[:20]:
        print("FAIL", failure)
    print(f"{total} inputs, {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
