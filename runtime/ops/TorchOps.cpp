// Registers the dflex operators with the PyTorch dispatcher, for Python:
//   torch.ops.load_library(".../libdflex_torch_ops.so")
//   torch.ops.dflex.version()
#include "dflex/runtime/Version.h"

#include <torch/library.h>

TORCH_LIBRARY(dflex, m) {
  m.def("version() -> str", [] { return dflex::runtime::versionString(); });
}
