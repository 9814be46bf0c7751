# The CUDA build, included by the top Makefile: cuda, test-cuda-build, test-gpu.
#
# `make cuda` makes a toolkit available (trainer/scripts/cuda_toolkit.sh: the installed one, or
# the pinned PyPI wheels, fetched once into a cache outside the repository), then builds
# $(CUDA_BUILD)/bin/cirrus-trainer: the plain build's objects, except ops_select.o which is
# compiled again with -DCIRRUS_CUDA, plus the .cu objects. So `--backend cpu` in that binary
# runs exactly the code of the plain one, and the extra compile is small. The plain `make`
# never reads this file's toolkit part and needs no CUDA.

CUDA_BUILD      := $(BUILD)/cuda
CUDA_TOOLKIT_MK := $(CUDA_BUILD)/toolkit.mk
CUDA_CU_SRC     := $(wildcard trainer/model/cuda/*.cu trainer/net/*.cu)
CUDA_CU_OBJ     := $(patsubst %.cu,$(CUDA_BUILD)/obj/%.o,$(CUDA_CU_SRC))
CUDA_SELECT_OBJ := $(CUDA_BUILD)/obj/trainer/model/ops_select.o
CUDA_LIB_OBJ    := $(filter-out $(BUILD)/obj/trainer/model/ops_select.o,$(LIB_OBJ)) \
                   $(CUDA_SELECT_OBJ) $(CUDA_CU_OBJ)

.PHONY: cuda test-cuda-build test-gpu
cuda: $(BIN)/cirrus-trainer
	bash trainer/scripts/cuda_toolkit.sh $(CUDA_TOOLKIT_MK)
	$(MAKE) --no-print-directory CIRRUS_CUDA_TOOLKIT=1 $(CUDA_BUILD)/bin/cirrus-trainer \
	  $(CUDA_BUILD)/bin/gpu-tests

# In make test, every run, on every machine: build it all, then what runs without a GPU.
test-cuda-build: cuda
	@echo "cirrus: the CUDA build without a GPU (--backend cuda refused cleanly)"
	bash tests/cuda/run.sh $(BIN)/cirrus-trainer $(CUDA_BUILD)/bin/cirrus-trainer \
	  $(CUDA_BUILD)/bin/gpu-tests

# On a GPU machine: every kernel, and the model, against the CPU reference. Without a GPU
# it says so and exits 0.
test-gpu: cuda
	$(CUDA_BUILD)/bin/gpu-tests

ifdef CIRRUS_CUDA_TOOLKIT
include $(CUDA_TOOLKIT_MK)

# Named targets (never -arch=native, which without a GPU silently picks a default):
# A100 (sm_80) and H100 (sm_90) machine code, plus sm_90 PTX that newer GPUs compile at load.
CUDA_ARCH  := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
NVCCFLAGS  := -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror -MMD -MP -I$(NCCL_INC)
CUDA_LDLIBS := -L$(CUDA_LIBDIR) -lcublas -lcudart -Wl,-rpath,$(CUDA_LIBDIR) \
               -L$(NCCL_LIBDIR) -lnccl -Wl,-rpath,$(NCCL_LIBDIR) -lstdc++

$(CUDA_BUILD)/obj/%.o: %.cu trainer/model/cuda/cuda.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# Bit-equal to the CPU needs unfused multiply-adds here (see the file's top comment).
$(CUDA_BUILD)/obj/trainer/model/cuda/optim_codec.o: NVCCFLAGS += -fmad=false

$(CUDA_SELECT_OBJ): trainer/model/ops_select.c trainer/model/cuda/cuda.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DCIRRUS_CUDA -I$(CUDA_INC) -c $< -o $@

$(CUDA_BUILD)/bin/cirrus-trainer: $(call obj,$(BUILD),trainer/cmd/main.c) $(CUDA_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDLIBS) $(CUDA_LDLIBS)

# The GPU tests print NCCL's version in their first line: it shows the library loads.
$(CUDA_BUILD)/obj/tests/cuda/%.o: tests/cuda/%.c trainer/model/cuda/cuda.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DCIRRUS_CUDA -I$(CUDA_INC) -I$(NCCL_INC) -c $< -o $@

$(CUDA_BUILD)/bin/gpu-tests: $(CUDA_BUILD)/obj/tests/cuda/gpu_tests.o $(CUDA_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDLIBS) $(CUDA_LDLIBS)
endif
