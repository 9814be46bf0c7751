# Real nodes (kubelets on containerd + runc, kube-proxy, CoreDNS) in a control plane of their
# own, running the image built from the Dockerfile. Include from the top Makefile after
# tests/cluster/cluster.mk. Root is needed for all but nodes-deps' builds.
#
#   make nodes-deps     Debian packages, kubelet + kube-proxy, CoreDNS (tests/nodes/install.sh)
#   make image          the Cirrus image from the Dockerfile (buildah), exported for the nodes
#   make cluster-up NODES=real    control plane + two real nodes (regions r1, r2); then
#                       eval "$$(tests/nodes/nodes.sh env)"; make cluster-down NODES=real
#   make test-nodes     the end-to-end test on real nodes (tests/nodes/e2e_test.sh)

NODES_SCRIPTS := $(dir $(lastword $(MAKEFILE_LIST)))

.PHONY: nodes-deps image test-nodes

nodes-deps:
	$(NODES_SCRIPTS)install.sh

image: nodes-deps
	$(NODES_SCRIPTS)image.sh

# Without root (containers, cgroups, iptables) the suite says so and is skipped, as the shaped
# WAN tests are.
test-nodes: $(BIN)/cirrus-trainer $(CORPUS)
	@if [ "$$(id -u)" != 0 ]; then \
	  echo "cirrus: SKIP test-nodes: real nodes need root (containers, cgroups, iptables)"; exit 0; fi; \
	$(MAKE) --no-print-directory image && \
	echo "cirrus: Cirrus on real nodes: helm install, a two-region SwarmJob, preemptions" && \
	CIRRUS_CORPUS=$(abspath $(CORPUS)) CIRRUS_TRAINER=$(abspath $(BIN)/cirrus-trainer) \
	  $(NODES_SCRIPTS)e2e_test.sh
