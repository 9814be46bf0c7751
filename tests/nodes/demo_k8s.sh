#!/usr/bin/env bash
# `make demo-k8s`: Cirrus on Kubernetes on this machine, start to finish. The control plane and
# two real nodes (regions r1, r2) come up, the image is built from the Dockerfile, the operator
# is installed with `helm install`, the sample two-region SwarmJob (manifests/samples/) is
# applied, scaled to this machine, and `kubectl get sj -w` shows its step, loss and WAN bytes
# until it succeeds; then text is sampled from the checkpoint the job wrote (into a claim
# backed by a folder on this machine), and everything is torn down. DEMO_KEEP=1 leaves the nodes up (tests/nodes/nodes.sh down removes them).
#   DEMO_STEPS (default 300)   the job's steps (the sample's 3,000 take about an hour here)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
need_root "make demo-k8s"
STEPS=${DEMO_STEPS:-300}
NS=cirrus-demo
BIN=${CIRRUS_TRAINER:-$REPO_DIR/build/bin/cirrus-trainer}
say() { printf '\n[demo-k8s] %s\n' "$*"; }

say "1/6 control plane and two real nodes (kubelet + containerd each), kube-proxy, CoreDNS"
"$here/nodes.sh" up
if [[ "${DEMO_KEEP:-0}" != 1 ]]; then
    trap 'say "6/6 teardown"; "$here/nodes.sh" down' EXIT
fi
eval "$("$here/nodes.sh" env)"
kubectl get nodes -L topology.kubernetes.io/region
"$here/nodes.sh" shape 20

say "2/6 helm install cirrus helm/cirrus (two operator replicas in pods on the nodes, one leading)"
install_operator_chart "$CIRRUS_NODES_STATE/helm.log" ||
    ndie "helm install: $(tail -5 "$CIRRUS_NODES_STATE/helm.log")"
kubectl -n cirrus-system get pods -o wide

say "3/6 the sample SwarmJob, scaled to this machine: $STEPS steps, 1 peer per stage, small CPU requests"
kubectl create namespace "$NS"
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted
# A claim for the checkpoints, backed by a folder on this machine: the default emptyDir goes
# with the client pod when it finishes.
ckdir=$CIRRUS_NODES_STATE/demo-checkpoints
mkdir -p "$ckdir"
chown 65532:65532 "$ckdir" # the image's user
kubectl apply -f - <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: cirrus-demo-checkpoints}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: cirrus-demo
  hostPath: {path: $ckdir, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: checkpoints, namespace: $NS}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: cirrus-demo
  resources: {requests: {storage: 1Gi}}
EOF
# The sample asks for 2 CPUs per peer and 3,000 steps; this machine has 2 cores in all.
kubectl create --dry-run=client -o json -f "$REPO_DIR/manifests/samples/swarmjob.yaml" |
    jq --argjson steps "$STEPS" 'del(.metadata.namespace) | .spec.steps = $steps | .spec.imagePullPolicy = "Never"
        | .spec.gateway.syncEvery = 50
        | .spec.checkpoint = {every: 100, volume: {claimName: "checkpoints"}}
        | .spec.regions |= map(.peers = {replicas: 1, min: 1}
            | .resources = {peer: {requests: {cpu: "300m", memory: "128Mi"}},
                            client: {requests: {cpu: "300m", memory: "128Mi"}},
                            gateway: {requests: {cpu: "100m", memory: "64Mi"}}})' |
    kubectl -n "$NS" apply -f -
job=$(kubectl -n "$NS" get sj -o jsonpath='{.items[0].metadata.name}')

say "4/6 kubectl get sj -w (phase, peers, step, loss, tokens/s, outer step, WAN bytes)"
kubectl -n "$NS" get sj -o wide -w &
watcher=$!
deadline=$((SECONDS + 1800))
until [[ "$(kubectl -n "$NS" get sj "$job" -o jsonpath='{.status.phase}')" =~ ^(Succeeded|Failed)$ ]]; do
    ((SECONDS < deadline)) || { kill "$watcher"; ndie "the job did not finish within 30 min"; }
    sleep 5
done
sleep 1
kill "$watcher" 2>/dev/null || true
kubectl -n "$NS" get sj "$job" -o wide
[[ "$(kubectl -n "$NS" get sj "$job" -o jsonpath='{.status.phase}')" == Succeeded ]] || ndie "the job failed"
kubectl -n "$NS" logs "$job-r1-c0" | tail -n 3

say "5/6 text sampled from region r1's checkpoint (in the job's checkpoint claim)"
[[ -s "$ckdir/r1/cirrus.ckpt" ]] || ndie "no checkpoint at $ckdir/r1 (the claim's folder)"
ls -l "$ckdir"/*/
"$BIN" sample --ckpt "$ckdir/r1" --prompt "And God said" --tokens 200
