# -*- Python -*- lit configuration for the dflex compiler tests.

import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "DFLEX"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.dflex_obj_root, "test")
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "unit", "runtime", "gpu", "Inputs"]

config.substitutions.append(("%examples", os.path.join(config.dflex_src_root, "examples")))
config.substitutions.append(("%python", config.python_executable))

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.dflex_tools_dir, append_path=True)
llvm_config.add_tool_substitutions(
    ["dflex-opt", "dflex-compile", "dflex-cache"], [config.dflex_tools_dir])
