# Coverage-guided fuzzing: libFuzzer harnesses (tests/fuzz/fuzz_*.c) built with clang under
# AddressSanitizer + UndefinedBehaviorSanitizer. Included by the Makefile.
#   make fuzz            every harness for FUZZ_SECONDS (default 600) each, two at a time;
#                        new inputs go to FUZZ_CACHE (outside the checked-in corpus)
#   make test-fuzz       replay the checked-in corpus, then FUZZ_TEST_SECONDS (default 30)
#                        each; non-zero on any crash, leak, UB, broken invariant or > 1 s input
#   make fuzz-merge      fold FUZZ_CACHE into the checked-in corpus, keeping only inputs that
#                        add coverage (libFuzzer -merge=1), so it stays small
#   make fuzz-coverage   line coverage of each harness's target files over the corpus
#   make fuzz-seeds      regenerate the binary seeds (frames, codec buffers, checkpoints)
#                        and the JSON seeds converted from the sample manifests
FUZZ_CC      ?= clang
LLVM_PROFDATA ?= llvm-profdata
LLVM_COV     ?= llvm-cov
FUZZ_SECONDS ?= 600
FUZZ_TEST_SECONDS ?= 30
FUZZ_BUILD   := $(BUILD)/fuzz
FUZZ_CACHE   ?= $(FUZZ_BUILD)/cache
FUZZ_SEEDS   := tests/fuzz/corpus
FUZZ_DEB_PKGS := clang libclang-rt-14-dev llvm

FUZZ_NAMES := wire q8 ckpt flags watch kubeconfig swarmjob pod lease progress wan_codec wan_msg swarm_msg

# What each harness links (besides tests/fuzz/fuzz_util.c) and the files it targets.
FUZZ_OPERATOR_SRC := $(OPERATOR_SRC) $(COMMON_SRC)
FUZZ_SRC_wire       := trainer/net/wire.c common/cerr.c
FUZZ_SRC_q8         := trainer/codec/q8.c common/cerr.c
FUZZ_SRC_ckpt       := trainer/ckpt/checkpoint.c trainer/model/gpt.c tests/fuzz/fuzz_ops.c common/cerr.c common/rng.c
FUZZ_SRC_flags      := common/flags.c common/cerr.c
FUZZ_WAN_CODEC_SRC  := trainer/gateway/wan_codec.c trainer/gateway/wan_codec_dense.c trainer/gateway/wan_codec_topk.c
FUZZ_SRC_wan_codec  := $(FUZZ_WAN_CODEC_SRC) common/cerr.c
FUZZ_SRC_wan_msg    := trainer/gateway/wan_msg.c trainer/gateway/outer_msg.c trainer/gateway/schedule.c trainer/net/wire.c $(FUZZ_WAN_CODEC_SRC) common/cerr.c common/names.c
FUZZ_SWARM_MSG_SRC  := trainer/swarm/proto/stage_msg.c trainer/swarm/proto/coord_msg.c trainer/codec/q8.c
FUZZ_SRC_swarm_msg  := $(FUZZ_SWARM_MSG_SRC) trainer/net/wire.c common/cerr.c common/names.c
FUZZ_TARGET_swarm_msg  := trainer/swarm/proto/stage_msg.c trainer/swarm/proto/coord_msg.c
FUZZ_TARGET_wire       := trainer/net/wire.c
FUZZ_TARGET_q8         := trainer/codec/q8.c
FUZZ_TARGET_ckpt       := trainer/ckpt/checkpoint.c
FUZZ_TARGET_flags      := common/flags.c
FUZZ_TARGET_watch      := operator/kube/watch.c
FUZZ_TARGET_kubeconfig := operator/kube/config.c operator/kube/yamljson.c
FUZZ_TARGET_swarmjob   := operator/desired.c operator/desired_spec.c operator/jobstatus.c
FUZZ_TARGET_pod        := operator/podstate.c operator/failpolicy.c operator/cache_slim.c
FUZZ_TARGET_lease      := operator/kube/lease.c
FUZZ_TARGET_progress   := operator/progress.c
FUZZ_TARGET_wan_codec  := $(FUZZ_WAN_CODEC_SRC)
FUZZ_TARGET_wan_msg    := trainer/gateway/wan_msg.c trainer/gateway/outer_msg.c trainer/gateway/schedule.c
FUZZ_LIBS_trainer   := -lz -lm
FUZZ_LIBS_operator  := $(OPERATOR_LDLIBS)
$(foreach n,watch kubeconfig swarmjob pod lease progress,$(eval FUZZ_SRC_$(n) := $(FUZZ_OPERATOR_SRC)))
$(foreach n,wire q8 ckpt flags swarm_msg,$(eval FUZZ_LIBS_$(n) := $(FUZZ_LIBS_trainer)))
$(foreach n,wan_codec wan_msg,$(eval FUZZ_LIBS_$(n) := $(FUZZ_LIBS_trainer) -lzstd))
$(foreach n,watch kubeconfig swarmjob pod lease progress,$(eval FUZZ_LIBS_$(n) := $(FUZZ_LIBS_operator)))

FUZZ_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) -g -O1 $(KUBE_CFLAGS) $(HTTP_CFLAGS) -MMD -MP
# The coverage build: no sanitizers (faster), source-based coverage counters.
FUZZ_COV    := -fprofile-instr-generate -fcoverage-mapping

$(FUZZ_BUILD)/obj/%.o: %.c Makefile tests/fuzz/fuzz.mk
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/cov/obj/%.o: %.c Makefile tests/fuzz/fuzz.mk
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_COV) -fsanitize=fuzzer-no-link -c $< -o $@

define FUZZ_HARNESS
$(FUZZ_BUILD)/bin/fuzz_$(1): $(call obj,$(FUZZ_BUILD),tests/fuzz/fuzz_$(1).c tests/fuzz/fuzz_util.c $(FUZZ_SRC_$(1)))
	@mkdir -p $$(dir $$@)
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer $$^ -o $$@ $(FUZZ_LIBS_$(1))
$(FUZZ_BUILD)/cov/bin/fuzz_$(1): $(call obj,$(FUZZ_BUILD)/cov,tests/fuzz/fuzz_$(1).c tests/fuzz/fuzz_util.c $(FUZZ_SRC_$(1)))
	@mkdir -p $$(dir $$@)
	$(FUZZ_CC) $(FUZZ_COV) -fsanitize=fuzzer $$^ -o $$@ $(FUZZ_LIBS_$(1))
endef
$(foreach n,$(FUZZ_NAMES),$(eval $(call FUZZ_HARNESS,$(n))))

FUZZ_BINS     := $(patsubst %,$(FUZZ_BUILD)/bin/fuzz_%,$(FUZZ_NAMES))
FUZZ_COV_BINS := $(patsubst %,$(FUZZ_BUILD)/cov/bin/fuzz_%,$(FUZZ_NAMES))

.PHONY: fuzz-deps fuzz-build fuzz test-fuzz fuzz-merge fuzz-coverage fuzz-seeds

fuzz-deps:
	@missing=""; for p in $(FUZZ_DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	echo "cirrus: installing Debian packages for fuzzing:$$missing"; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "cirrus: installing packages needs root; run as root or: sudo apt-get install$$missing" >&2; exit 1; \
	fi; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 $$missing

fuzz-build: fuzz-deps
	$(MAKE) --no-print-directory $(FUZZ_BINS)

fuzz: fuzz-build
	bash tests/fuzz/run.sh fuzz $(FUZZ_BUILD)/bin $(FUZZ_SEEDS) $(FUZZ_CACHE) $(FUZZ_BUILD)/artifacts \
	  $(FUZZ_SECONDS) $(FUZZ_NAMES)

# The corpus replay first (every checked-in input, crash regressions included), then a short
# run from a scratch corpus so the checked-in one is never written.
test-fuzz: fuzz-build
	@echo "cirrus: fuzz harnesses: replaying the checked-in corpus"
	bash tests/fuzz/run.sh replay $(FUZZ_BUILD)/bin $(FUZZ_SEEDS) - $(FUZZ_BUILD)/test-artifacts 0 $(FUZZ_NAMES)
	@echo "cirrus: fuzz harnesses: $(FUZZ_TEST_SECONDS) s each"
	rm -rf $(FUZZ_BUILD)/test-corpus
	bash tests/fuzz/run.sh fuzz $(FUZZ_BUILD)/bin $(FUZZ_SEEDS) $(FUZZ_BUILD)/test-corpus \
	  $(FUZZ_BUILD)/test-artifacts $(FUZZ_TEST_SECONDS) $(FUZZ_NAMES)

fuzz-merge: fuzz-build
	@for n in $(FUZZ_NAMES); do \
	  [ -d $(FUZZ_CACHE)/$$n ] || continue; \
	  $(FUZZ_BUILD)/bin/fuzz_$$n -merge=1 -timeout=1 $(FUZZ_SEEDS)/$$n $(FUZZ_CACHE)/$$n 2>&1 | grep -E '^MERGE-OUTER: [0-9]+ new files' ; \
	done

fuzz-coverage: fuzz-deps
	$(MAKE) --no-print-directory $(FUZZ_COV_BINS)
	@$(foreach n,$(FUZZ_NAMES),bash tests/fuzz/coverage.sh $(n) $(FUZZ_BUILD)/cov $(FUZZ_SEEDS) $(FUZZ_CACHE) \
	  $(LLVM_PROFDATA) $(LLVM_COV) $(FUZZ_TARGET_$(n)) || exit 1;)

fuzz-seeds: $(FUZZ_BUILD)/bin/fuzz_seeds
	$(FUZZ_BUILD)/bin/fuzz_seeds $(FUZZ_SEEDS)

$(FUZZ_BUILD)/bin/fuzz_seeds: $(call obj,$(FUZZ_BUILD)/seeds,tests/fuzz/seeds.c trainer/net/wire.c trainer/codec/q8.c trainer/ckpt/checkpoint.c trainer/model/gpt.c tests/fuzz/fuzz_ops.c operator/kube/yamljson.c common/cerr.c common/rng.c $(FUZZ_WAN_CODEC_SRC) trainer/gateway/wan_msg.c trainer/gateway/outer_msg.c trainer/gateway/schedule.c common/names.c trainer/swarm/proto/stage_msg.c trainer/swarm/proto/coord_msg.c)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $^ -o $@ $(KUBE_LIBS) -lz -lzstd -lm

$(FUZZ_BUILD)/seeds/obj/%.o: %.c Makefile tests/fuzz/fuzz.mk
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@
