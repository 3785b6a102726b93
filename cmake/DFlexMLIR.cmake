# Finds MLIR 19 and sets up the flags its targets need. Debian's LLVM is built
# without exceptions: targets made with dflex_mlir_target() get -fno-exceptions,
# runtime code never links them.
if(NOT MLIR_DIR)
  set(MLIR_DIR /usr/lib/llvm-19/lib/cmake/mlir)
endif()
find_package(MLIR REQUIRED CONFIG PATHS ${MLIR_DIR})
message(STATUS "dflex: MLIR from ${MLIR_DIR}, LLVM ${LLVM_PACKAGE_VERSION}")

list(APPEND CMAKE_MODULE_PATH "${MLIR_CMAKE_DIR}" "${LLVM_CMAKE_DIR}")
set(LLVM_RUNTIME_OUTPUT_INTDIR ${CMAKE_BINARY_DIR}/bin)
set(LLVM_LIBRARY_OUTPUT_INTDIR ${CMAKE_BINARY_DIR}/lib)
set(MLIR_BINARY_DIR ${CMAKE_BINARY_DIR})
include(TableGen)
include(AddLLVM)
include(AddMLIR)

# Debian ships lit as a script under build/utils, not as bin/llvm-lit.
if(NOT LLVM_EXTERNAL_LIT OR NOT EXISTS "${LLVM_EXTERNAL_LIT}")
  set(LLVM_EXTERNAL_LIT ${LLVM_LIBRARY_DIR}/../build/utils/lit/lit.py)
endif()

# Usage-requirement target for everything built against MLIR.
add_library(dflex_mlir_flags INTERFACE)
target_include_directories(dflex_mlir_flags SYSTEM INTERFACE ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
target_include_directories(dflex_mlir_flags INTERFACE
  ${DFLEX_SOURCE_DIR}/dialects ${DFLEX_BINARY_DIR}/dialects ${DFLEX_SOURCE_DIR}/include)
target_compile_definitions(dflex_mlir_flags INTERFACE ${LLVM_DEFINITIONS})
if(NOT LLVM_ENABLE_EH)
  target_compile_options(dflex_mlir_flags INTERFACE -fno-exceptions)
endif()
if(NOT LLVM_ENABLE_RTTI)
  target_compile_options(dflex_mlir_flags INTERFACE -fno-rtti)
endif()

