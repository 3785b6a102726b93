# Finds LibTorch from the python3 that has torch (PyPI wheel on CPU machines,
# the preinstalled one on GPU machines): one API for both.
if(NOT Torch_DIR)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE DFLEX_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE DFLEX_TORCH_FOUND)
  if(NOT DFLEX_TORCH_FOUND EQUAL 0)
    message(FATAL_ERROR "dflex: python3 cannot import torch; run scripts/setup.sh or set Torch_DIR")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${DFLEX_TORCH_PREFIX})
endif()
# LibTorch's config probes CUDA through its own module; the toolkit is already found.
find_package(Torch REQUIRED)
message(STATUS "dflex: LibTorch ${Torch_VERSION}")
