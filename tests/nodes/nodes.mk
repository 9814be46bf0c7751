# Real nodes (kubelets on containerd + runc, kube-proxy, CoreDNS) in a control plane of their
# own, running the image built from the Dockerfile. Include from the top Makefile after
# tests/cluster/cluster.mk. Root is needed for all but nodes-deps' builds.
#
#   make nodes-deps     Debian packages, kubelet + kube-proxy, CoreDNS (tests/nodes/install.sh)
#   make image          the Cirrus image from the Dockerfile (buildah), exported for the nodes
#   make cluster-up NODES=real    control plane + two real nodes (regions r1, r2); then
#                       eval "$$(tests/nodes/nodes.sh env)"; make cluster-down NODES=real
#                       (CLUSTERS=2: two clusters, r2's in a network namespace of its own)
#   make test-nodes     the end-to-end tests on real nodes: one cluster (tests/nodes/e2e_test.sh),
#                       then a job across two (multicluster_e2e.sh)
#   make demo-k8s       helm install, the sample SwarmJob trained and watched, text sampled
#                       from its checkpoint, teardown (tests/nodes/demo_k8s.sh)
#   make bench-k8s      tokens/s of a SwarmJob against `local`, apply -> first step,
#                       preemption -> replacement serving (tests/nodes/bench_k8s.sh)

NODES_SCRIPTS := $(dir $(lastword $(MAKEFILE_LIST)))

.PHONY: nodes-deps image nodes-prep test-nodes demo-k8s bench-k8s

nodes-deps:
	$(NODES_SCRIPTS)install.sh

image: nodes-deps
	$(NODES_SCRIPTS)image.sh

# Without root (containers, cgroups, iptables) these say so and are skipped, as the shaped
# WAN tests are. nodes-prep (the packages, kubelet, CoreDNS, the images) is a target of its
# own so that `make test` can run it beside a suite that mostly waits.
NODES_NEED_ROOT = [ "$$(id -u)" = 0 ] || { echo "cirrus: SKIP $@: real nodes need root (containers, cgroups, iptables)"; exit 0; }

nodes-prep:
	@$(NODES_NEED_ROOT); $(MAKE) --no-print-directory image

# CIRRUS_NODES_NICE: the nice level of the test and of everything it starts (containerd, the
# kubelets and so the pods); make test sets 10, the test running beside operator tests.
test-nodes: nodes-prep $(BIN)/cirrus-trainer $(CORPUS)
	@$(NODES_NEED_ROOT); \
	echo "cirrus: Cirrus on real nodes: helm install, a two-region SwarmJob, preemptions; then one across two clusters"; \
	export CIRRUS_CORPUS=$(abspath $(CORPUS)) CIRRUS_TRAINER=$(abspath $(BIN)/cirrus-trainer); \
	nice -n $${CIRRUS_NODES_NICE:-0} $(NODES_SCRIPTS)e2e_test.sh; one=$$?; \
	nice -n $${CIRRUS_NODES_NICE:-0} $(NODES_SCRIPTS)multicluster_e2e.sh; two=$$?; \
	[ $$one = 0 ] && [ $$two = 0 ]

demo-k8s: deps
	@[ "$$(id -u)" = 0 ] || { echo "cirrus: demo-k8s runs real nodes and needs root" >&2; exit 1; }
	$(MAKE) --no-print-directory all image
	CIRRUS_TRAINER=$(abspath $(BIN)/cirrus-trainer) $(NODES_SCRIPTS)demo_k8s.sh

bench-k8s: deps
	@[ "$$(id -u)" = 0 ] || { echo "cirrus: bench-k8s runs real nodes and needs root" >&2; exit 1; }
	$(MAKE) --no-print-directory all data image
	CIRRUS_CORPUS=$(abspath $(CORPUS)) CIRRUS_TRAINER=$(abspath $(BIN)/cirrus-trainer) \
	  $(NODES_SCRIPTS)bench_k8s.sh
