#!/usr/bin/env python3
"""scripts/check_layers.py refuses an include that runs up the layers and
accepts the same tree once the layers allow it."""
import pathlib
import subprocess
import sys
import tempfile

checker = pathlib.Path(sys.argv[1])
with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    (root / "runtime/low").mkdir(parents=True)
    (root / "runtime/high").mkdir(parents=True)
    (root / "runtime/include/dflex/runtime/high").mkdir(parents=True)
    (root / "runtime/low/Low.cpp").write_text('#include "dflex/runtime/high/High.h"\n')
    (root / "runtime/include/dflex/runtime/high/High.h").write_text("#pragma once\n")

    def check(lines):
        (root / "layers.txt").write_text(lines)
        return subprocess.run([sys.executable, str(checker), "--root", str(root), "--layers",
                               str(root / "layers.txt")], capture_output=True, text=True)

    upward = check("low dflex/runtime/low/ runtime/low -\n"
                   "high dflex/runtime/high/ runtime/high low\n")
    assert upward.returncode == 1, upward
    assert "runtime/low/Low.cpp:1: layer low includes dflex/runtime/high/High.h of layer high" \
        in upward.stderr, upward.stderr
    allowed = check("low dflex/runtime/low/ runtime/low high\n"
                    "high dflex/runtime/high/ runtime/high -\n")
    assert allowed.returncode == 0, allowed.stderr
    cycle = check("low dflex/runtime/low/ runtime/low high\n"
                  "high dflex/runtime/high/ runtime/high low\n")
    assert cycle.returncode != 0 and "cycle" in (cycle.stderr + str(cycle.stdout)), cycle
print("check_layers: upward include refused, allowed include accepted, cycle refused")
