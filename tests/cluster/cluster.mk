# Test cluster (real kube-apiserver, etcd, kube-scheduler, kube-controller-manager, kwok on
# 127.0.0.1). Include from the top Makefile:  include tests/cluster/cluster.mk
#
#   make cluster-deps   build/install the binaries into the cache (once per version)
#   make cluster-up     start the cluster; state in $(BUILD)/cluster, then
#                       eval "$$(tests/cluster/cluster.sh env)" for KUBECONFIG and kubectl
#   make cluster-down   stop it and remove $(BUILD)/cluster
#   make test-cluster   smoke test: up, checks, down (reuses a running cluster-up cluster)
#   make cluster-up NODES=real / cluster-down NODES=real: real nodes instead (tests/nodes/)

BUILD ?= build
CLUSTER_SCRIPTS := $(dir $(lastword $(MAKEFILE_LIST)))
CLUSTER_STATE_DIR ?= $(abspath $(BUILD)/cluster)
export CLUSTER_STATE_DIR

.PHONY: cluster-deps cluster-up cluster-down test-cluster

cluster-deps:
	$(CLUSTER_SCRIPTS)install.sh

# NODES=real: real kubelets running the Cirrus image instead of kwok's fake nodes
# (tests/nodes/nodes.mk; needs root).
ifeq ($(NODES),real)
# CLUSTERS=2: two clusters (the second, east, runs region r2 in a network namespace of its own).
cluster-up: image
	NODES_CLUSTERS=$(or $(CLUSTERS),1) tests/nodes/nodes.sh up
cluster-down:
	tests/nodes/nodes.sh down
else
cluster-up: cluster-deps
	$(CLUSTER_SCRIPTS)cluster.sh up
cluster-down:
	$(CLUSTER_SCRIPTS)cluster.sh down
endif

test-cluster: cluster-deps
	$(CLUSTER_SCRIPTS)smoke_test.sh
