# What the kernel harnesses' Makefiles (test/gpu/attention, test/gpu/gated_delta)
# share. A harness sets, then includes this file:
#   HARNESS          its test program, built from $(HARNESS).cu
#   SOURCES          the files that program depends on
#   FLAGS            nvcc flags of every compile of it
#   ARCH, arch_flags the architecture `make` builds for and its nvcc flags
#                    ($(call arch_flags,ARCH))
#   RESOURCE_ARCHS   the architectures `make resources` compiles for
#   RESOURCE_LINES   the lines of ptxas's report it prints (grep -E pattern)
#   SANITIZE_ARGS    the program's arguments under compute-sanitizer
#   BUILD_DIR        where the binaries go
# and gets the targets $(BUILD_DIR)/$(HARNESS) (the default), run, sanitize,
# resources, nvrtc-check (its nvrtc_check.cpp, through NVRTC) and clean.
NVCC ?= /usr/local/cuda/bin/nvcc
SANITIZER ?= $(dir $(NVCC))compute-sanitizer
ROOT := $(abspath ../../..)
comma := ,

$(BUILD_DIR)/$(HARNESS): $(SOURCES)
	@mkdir -p $(BUILD_DIR)
	$(NVCC) $(FLAGS) $(call arch_flags,$(ARCH)) -o $@ $(HARNESS).cu

run: $(BUILD_DIR)/$(HARNESS)
	$(BUILD_DIR)/$(HARNESS)

sanitize: $(BUILD_DIR)/$(HARNESS)
	for tool in memcheck racecheck; do \
	  $(SANITIZER) --tool $$tool --error-exitcode 1 $(BUILD_DIR)/$(HARNESS) $(SANITIZE_ARGS) || exit 1; \
	done

resources: $(SOURCES)
	@mkdir -p $(BUILD_DIR)
	$(foreach arch,$(RESOURCE_ARCHS),\
	  $(NVCC) $(FLAGS) $(call arch_flags,$(arch)) -Xptxas -v -c $(HARNESS).cu -o $(BUILD_DIR)/$(HARNESS)_$(arch).o \
	    2>&1 | grep -E '$(RESOURCE_LINES)' || exit 1;)

$(BUILD_DIR)/nvrtc_check: nvrtc_check.cpp $(ROOT)/test/gpu/common/nvrtc_check.h
	@mkdir -p $(BUILD_DIR)
	$(NVCC) -std=c++17 -O2 -o $@ nvrtc_check.cpp -lnvrtc

nvrtc-check: $(BUILD_DIR)/nvrtc_check
	$(BUILD_DIR)/nvrtc_check $(ROOT)/kernels

clean:
	rm -rf $(BUILD_DIR)

.PHONY: run sanitize resources nvrtc-check clean
