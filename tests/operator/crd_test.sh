#!/usr/bin/env bash
# The SwarmJob API and the plain manifests against the real control plane (run by run.sh with
# KUBECONFIG set and kubectl on PATH):
#   * kubectl apply -f manifests/ works, twice (the second time changes nothing), and the
#     operator Deployment rolls out (kwok runs no container: valid and schedulable is all);
#   * the sample SwarmJob and a minimal one are accepted and defaulted; `kubectl get sj` shows
#     the printer columns, filled from a status written as the operator's ServiceAccount, whose
#     schema is enforced (a negative step, an unknown phase, a progressTime not a date-time);
#   * invalid SwarmJobs are refused at apply, each with an error that names the field;
#   * model, pipeline stages and region names cannot change after creation; scaling can;
#   * regions in several clusters: spec.clusters, regions[].cluster and endpoint, spec.home
#     (a copy in a member cluster) are accepted as they should be and refused otherwise, and
#     a region's cluster and a copy's home cannot change;
#   * RBAC: the operator's ServiceAccount can do what it needs and nothing much else; the
#     chart's memberAccess ServiceAccount (a home cluster's operator in this one) as well,
#     through a kubeconfig made as helm/cirrus/values.yaml tells.
# Leaves manifests/ applied (the CRD and cirrus-system), removes its own test namespace.
# Last line: "crd: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
sample=$root/manifests/samples/swarmjob.yaml
NS=cirrus-crd-test
SA=system:serviceaccount:cirrus-system:cirrus-operator
k() { kubectl "$@"; }
sj_get() { k get sj -n "$NS" "$1" -o jsonpath="{$2}"; }
# The chart's memberAccess objects this test makes: <name>-home, cluster-wide and in $NS.
MEMBER_ALL=cirrus-crd-test-all
MEMBER_NS=cirrus-crd-test-ns
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    k delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
    k delete clusterrole,clusterrolebinding "$MEMBER_ALL-home" --ignore-not-found >/dev/null 2>&1
    k -n cirrus-system delete serviceaccount "$MEMBER_ALL-home" "$MEMBER_NS-home" --ignore-not-found >/dev/null 2>&1
}
trap cleanup EXIT
fail_fast() { not_ok "$*"; checks_summary crd; exit 1; }

# ---- manifests/ ----------------------------------------------------------------------------

out=$(k apply -f "$root/manifests/" 2>&1) || fail_fast "kubectl apply -f manifests/: $out"
ok "kubectl apply -f manifests/"
k wait --for condition=Established --timeout=30s crd/swarmjobs.cirrus.dev >/dev/null 2>&1 ||
    fail_fast "the SwarmJob CRD did not become Established"
# A PodDisruptionBudget's selector has the "replace" patch strategy, so client-side apply
# always sends it and says "configured" although nothing changes: for it, the proof is that
# its generation (bumped by any spec change) stays where it was.
pdb_gen() { k -n cirrus-system get pdb cirrus-operator -o jsonpath='{.metadata.generation}'; }
gen=$(pdb_gen)
if out=$(k apply -f "$root/manifests/" 2>&1) &&
    ! grep -v ' unchanged$' <<<"$out" | grep -qv '^poddisruptionbudget.policy/cirrus-operator configured$' &&
    [[ -n "$gen" && "$(pdb_gen)" == "$gen" ]]; then
    ok "kubectl apply -f manifests/ again: everything unchanged"
else
    not_ok "second kubectl apply -f manifests/ changed something: $out (PDB generation $gen -> $(pdb_gen))"
fi
check "operator Deployment rolls out (scheduled, Ready under kwok)" \
    k -n cirrus-system rollout status deployment/cirrus-operator --timeout=60s
expect_eq "Deployment args" "--leader-elect --metrics-port=8080 --cluster-name=home" \
    "$(k -n cirrus-system get deployment cirrus-operator -o jsonpath='{.spec.template.spec.containers[0].args[*]}')"
expect_eq "operator runs as non-root with a read-only root filesystem" "true true" \
    "$(k -n cirrus-system get deployment cirrus-operator -o jsonpath='{.spec.template.spec.securityContext.runAsNonRoot} {.spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem}')"
expect_eq "cirrus-system enforces the restricted Pod Security Standard" restricted \
    "$(k get namespace cirrus-system -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}')"
expect_eq "short name and scope" "sj Namespaced" \
    "$(k get crd swarmjobs.cirrus.dev -o jsonpath='{.spec.names.shortNames[0]} {.spec.scope}')"

# A namespace left by an earlier run (still terminating, perhaps) is deleted first.
k delete namespace "$NS" --ignore-not-found --timeout=60s >/dev/null 2>&1
k create namespace "$NS" >/dev/null 2>&1 || fail_fast "cannot create namespace $NS"

# ---- the sample and defaults ---------------------------------------------------------------

out=$(k apply -n "$NS" -f "$sample" 2>&1) || fail_fast "the sample SwarmJob was refused: $out"
ok "sample SwarmJob accepted"
expect_eq "sample: regions" "r1 r2" "$(sj_get tiny-bible '.spec.regions[*].name')"
expect_eq "sample: default gateway.serviceType" ClusterIP "$(sj_get tiny-bible .spec.gateway.serviceType)"
expect_eq "sample: default gateway.port" 7400 "$(sj_get tiny-bible .spec.gateway.port)"
expect_eq "sample: default placement.regionLabel" "topology.kubernetes.io/region topology.kubernetes.io/region" \
    "$(sj_get tiny-bible '.spec.regions[*].placement.regionLabel')"
expect_eq "sample: default suspend" false "$(sj_get tiny-bible .spec.suspend)"
expect_eq "sample: default data.batchSize" 8 "$(sj_get tiny-bible .spec.data.batchSize)"
expect_eq "sample: kept runPolicy.backoffLimit" 4 "$(sj_get tiny-bible .spec.runPolicy.backoffLimit)"
expect_eq "sample: its podFailurePolicy rules" "FailJob Ignore Ignore" "$(sj_get tiny-bible '.spec.runPolicy.podFailurePolicy.rules[*].action')"

minimal='apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata:
  name: minimal
spec:
  image: cirrus:latest
  regions:
    - name: r1'
check "minimal SwarmJob (image and one region name) accepted" k apply -n "$NS" -f - <<<"$minimal"
expect_eq "minimal: model.preset, pipeline.stages, steps" "tiny 1 1000" \
    "$(sj_get minimal '.spec.model.preset} {.spec.pipeline.stages} {.spec.steps')"
expect_eq "minimal: peers replicas/min/max, clients" "2 1  1" \
    "$(sj_get minimal '.spec.regions[0].peers.replicas} {.spec.regions[0].peers.min} {.spec.regions[0].peers.max} {.spec.regions[0].clients')"
expect_eq "minimal: default successPolicy.operator" All "$(sj_get minimal .spec.successPolicy.operator)"
expect_eq "minimal: default gangScheduling" false "$(sj_get minimal .spec.gangScheduling)"
expect_eq "minimal: gateway syncEvery/codec/wanPort/outerLearningRate/outerMomentum/serviceType/fragments" \
    "100 q8 7443 0.7 0.9 ClusterIP 1" \
    "$(sj_get minimal '.spec.gateway.syncEvery} {.spec.gateway.codec} {.spec.gateway.wanPort} {.spec.gateway.outerLearningRate} {.spec.gateway.outerMomentum} {.spec.gateway.serviceType} {.spec.gateway.fragments')"
expect_eq "sample: gateway syncEvery/codec/wanPort" "100 q8 7443" \
    "$(sj_get tiny-bible '.spec.gateway.syncEvery} {.spec.gateway.codec} {.spec.gateway.wanPort')"
expect_eq "minimal: checkpoint.every, runPolicy.backoffLimit, imagePullPolicy" "100 6 IfNotPresent" \
    "$(sj_get minimal '.spec.checkpoint.every} {.spec.runPolicy.backoffLimit} {.spec.imagePullPolicy')"

# ---- printer columns and the status subresource, written as the operator -------------------

header=$(k get sj -n "$NS" 2>&1 | head -1)
if [[ "$header" =~ ^NAME\ +PHASE\ +REGIONS\ +READY\ +STEP\ +AGE$ ]]; then
    ok "kubectl get sj columns: $header"
else
    not_ok "kubectl get sj header: '$header'"
fi
header=$(k get sj -n "$NS" -o wide 2>&1 | head -1)
if [[ "$header" =~ ^NAME\ +PHASE\ +REGIONS\ +READY\ +STEP\ +LOSS\ +TOKENS/S\ +OUTER\ +WAN\ BYTES\ +AGE$ ]]; then
    ok "kubectl get sj -o wide columns: $header"
else
    not_ok "kubectl get sj -o wide header: '$header'"
fi
status='{"status":{"phase":"Running","observedGeneration":1,"readyRegions":"2/2","readyPeers":"4/4","step":120,"loss":3.25,"tokensPerSecond":5120.5,"outerStep":-1,"wanBytes":734003,
  "conditions":[{"type":"Running","status":"True","reason":"AllRegionsReady","message":"2 of 2 regions training","lastTransitionTime":"2026-01-02T03:04:05Z"}],
  "regions":[{"name":"r1","readyPeersPerStage":[2,2],"pendingPods":0,"preemptions":3,"failures":0,"step":120,"loss":3.25,"tokensPerSecond":5120.5,"outerStep":1,"wanBytes":734003},{"name":"r2","readyPeersPerStage":[1,1],"pendingPods":2,"preemptions":1,"failures":1,"outerStep":-1,"wanBytes":0}]}}'
check "operator ServiceAccount patches the status subresource" \
    k --as="$SA" patch sj -n "$NS" tiny-bible --subresource=status --type=merge -p "$status"
row=$(k get sj -n "$NS" tiny-bible --no-headers 2>&1)
if [[ "$row" =~ ^tiny-bible\ +Running\ +2/2\ +4/4\ +120\ + ]]; then
    ok "kubectl get sj row: $row"
else
    not_ok "kubectl get sj row: '$row'"
fi
expect_eq "status.regions[1].readyPeersPerStage" "[1,1]" "$(sj_get tiny-bible '.status.regions[1].readyPeersPerStage')"
row=$(k get sj -n "$NS" tiny-bible -o wide --no-headers 2>&1)
if [[ "$row" =~ ^tiny-bible\ +Running\ +2/2\ +4/4\ +120\ +3.25\ +5120.5\ +-1\ +734003\ + ]]; then
    ok "kubectl get sj -o wide row (outer step, WAN bytes): $row"
else
    not_ok "kubectl get sj -o wide row: '$row'"
fi
expect_eq "status.regions[*] outerStep, wanBytes" "1 -1 734003 0" \
    "$(sj_get tiny-bible '.status.regions[*].outerStep} {.status.regions[*].wanBytes')"
for bad in '[{"op":"replace","path":"/status/regions/1/outerStep","value":-2}]' \
    '[{"op":"replace","path":"/status/regions/0/wanBytes","value":-1}]' \
    '[{"op":"replace","path":"/status/outerStep","value":-2}]' \
    '[{"op":"replace","path":"/status/wanBytes","value":-5}]'; do
    out=$(k --as="$SA" patch sj -n "$NS" tiny-bible --subresource=status --type=json -p "$bad" 2>&1)
    if [[ $? -ne 0 && "$out" == *"greater than or equal to"* ]]; then
        ok "status refused: $bad"
    else
        not_ok "status accepted: $bad: $out"
    fi
done
expect_eq "status.regions[0] step, loss, tokensPerSecond" "120 3.25 5120.5" \
    "$(sj_get tiny-bible '.status.regions[0].step} {.status.regions[0].loss} {.status.regions[0].tokensPerSecond')"
out=$(k --as="$SA" patch sj -n "$NS" tiny-bible --subresource=status --type=json -p '[{"op":"replace","path":"/status/regions/0/step","value":-1}]' 2>&1)
if [[ $? -ne 0 && "$out" == *regions*step* ]]; then ok "negative status.regions[].step refused"; else not_ok "status.regions[0].step -1: $out"; fi
check "status.regions[].progressTime takes an RFC 3339 time" \
    k --as="$SA" patch sj -n "$NS" tiny-bible --subresource=status --type=json -p '[{"op":"add","path":"/status/regions/0/progressTime","value":"2026-01-02T03:04:05Z"}]'
expect_eq "status.regions[0].progressTime" "2026-01-02T03:04:05Z" "$(sj_get tiny-bible '.status.regions[0].progressTime')"
out=$(k --as="$SA" patch sj -n "$NS" tiny-bible --subresource=status --type=json -p '[{"op":"replace","path":"/status/regions/0/progressTime","value":"yesterday"}]' 2>&1)
if [[ $? -ne 0 && "$out" == *regions*progressTime* ]]; then ok "status.regions[].progressTime not a date-time refused"; else not_ok "status.regions[0].progressTime yesterday: $out"; fi
out=$(k --as="$SA" patch sj -n "$NS" tiny-bible --subresource=status --type=merge -p '{"status":{"phase":"Exploded"}}' 2>&1)
if [[ $? -ne 0 && "$out" == *status.phase* ]]; then ok "unknown status.phase refused"; else not_ok "status.phase Exploded: $out"; fi
# The operator patches a job for its finalizer only (RBAC cannot tell a patch's fields apart),
# and may not update (replace) a job.
sa_replace() { k get sj -n "$NS" tiny-bible -o json | k --as="$SA" replace -f -; }
check_not "operator ServiceAccount cannot replace a SwarmJob" sa_replace
check "operator ServiceAccount adds the finalizer cirrus.dev/member-copies by merge patch" \
    k --as="$SA" patch sj -n "$NS" tiny-bible --type=merge -p '{"metadata":{"finalizers":["cirrus.dev/member-copies"]}}'
expect_eq "finalizers" cirrus.dev/member-copies "$(sj_get tiny-bible '.metadata.finalizers[*]')"
check "operator ServiceAccount removes it by merge patch" \
    k --as="$SA" patch sj -n "$NS" tiny-bible --type=merge -p '{"metadata":{"finalizers":null}}'
expect_eq "finalizers after removal" "" "$(sj_get tiny-bible '.metadata.finalizers')"

# ---- invalid SwarmJobs are refused, naming the field -----------------------------------------

n=0
# refuse DESCRIPTION FIELD MESSAGE-FRAGMENT JSON-PATCH-OPS: the sample with the patch applied
# (as a new SwarmJob) must be refused, with an error naming FIELD and containing the fragment.
refuse() {
    local what=$1 field=$2 frag=$3 ops=$4 name out
    n=$((n + 1))
    name=bad-$n
    [[ "$ops" == *'"/metadata/name"'* ]] || ops="[{\"op\":\"replace\",\"path\":\"/metadata/name\",\"value\":\"$name\"},${ops#[}"
    if ! out=$(k patch --local -f "$sample" --type=json -p "$ops" -o yaml 2>&1); then
        not_ok "$what: bad test patch: $out"
        return
    fi
    if out=$(k apply -n "$NS" -f - <<<"$out" 2>&1); then
        not_ok "$what: accepted"
        k delete sj -n "$NS" "$name" --wait=false >/dev/null 2>&1
    elif [[ "$out" == *"$field"* && "$out" == *"$frag"* ]]; then
        ok "refused: $what -> $(grep -F -m1 "$field" <<<"$out" | sed 's/^\* //; s/^The SwarmJob "[^"]*" is invalid: //')"
    else
        not_ok "$what: refused without naming $field / '$frag': $out"
    fi
}
refuse "peers.min > replicas" "spec.regions[0].peers.min" "must be <= peers.replicas" \
    '[{"op":"replace","path":"/spec/regions/0/peers/min","value":3}]'
refuse "peers.max < replicas" "spec.regions[0].peers.max" "must be >= peers.replicas" \
    '[{"op":"replace","path":"/spec/regions/0/peers/max","value":1}]'
refuse "duplicate region names" "spec.regions[1]" "Duplicate value" \
    '[{"op":"replace","path":"/spec/regions/1/name","value":"r1"}]'
refuse "region name not a DNS label" "spec.regions[1].name" "must be a DNS label" \
    '[{"op":"replace","path":"/spec/regions/1/name","value":"R_2"}]'
refuse "region name over 24 characters" "spec.regions[0].name" "Too long" \
    '[{"op":"replace","path":"/spec/regions/0/name","value":"a-region-name-of-25-chars"}]'
refuse "pipeline.stages 0" "spec.pipeline.stages" "greater than or equal to 1" \
    '[{"op":"replace","path":"/spec/pipeline/stages","value":0}]'
refuse "stages > the preset's layers" "spec.pipeline.stages" "must not exceed the model's layer count" \
    '[{"op":"replace","path":"/spec/pipeline/stages","value":5}]'
refuse "stages > explicit model.layers" "spec.pipeline.stages" "must not exceed the model's layer count" \
    '[{"op":"add","path":"/spec/model/layers","value":1}]'
refuse "heads not dividing width" "spec.model.heads" "must divide model.width" \
    '[{"op":"add","path":"/spec/model/width","value":96},{"op":"add","path":"/spec/model/heads","value":5}]'
refuse "unknown model preset" "spec.model.preset" 'Unsupported value: "huge"' \
    '[{"op":"replace","path":"/spec/model/preset","value":"huge"}]'
refuse "unknown codec" "spec.gateway.codec" 'should match' \
    '[{"op":"replace","path":"/spec/gateway/codec","value":"zstd"}]'
refuse "the older CRD's codec fp32 (now none)" "spec.gateway.codec" 'should match' \
    '[{"op":"replace","path":"/spec/gateway/codec","value":"fp32"}]'
refuse "topk density above 1" "spec.gateway.codec" 'should match' \
    '[{"op":"replace","path":"/spec/gateway/codec","value":"topk:1.5"}]'
refuse "topk density 0" "spec.gateway.codec" 'should match' \
    '[{"op":"replace","path":"/spec/gateway/codec","value":"topk:0.0+zstd"}]'
refuse "lowbit:3" "spec.gateway.codec" 'should match' \
    '[{"op":"replace","path":"/spec/gateway/codec","value":"lowbit:3"}]'
refuse "syncEvery 0" "spec.gateway.syncEvery" "greater than or equal to 1" \
    '[{"op":"replace","path":"/spec/gateway/syncEvery","value":0}]'
refuse "syncEvery above 1000000" "spec.gateway.syncEvery" "less than or equal to 1000000" \
    '[{"op":"replace","path":"/spec/gateway/syncEvery","value":1000001}]'
refuse "wanPort == port" "spec.gateway.wanPort" "gateway.wanPort must differ from gateway.port" \
    '[{"op":"add","path":"/spec/gateway/port","value":9000},{"op":"add","path":"/spec/gateway/wanPort","value":9000}]'
refuse "wanPort == the default port" "spec.gateway.wanPort" "gateway.wanPort must differ from gateway.port" \
    '[{"op":"add","path":"/spec/gateway/wanPort","value":7400}]'
refuse "wanPort on the gateway's HTTP port" "spec.gateway.wanPort" "must not be 7400 or 7480" \
    '[{"op":"add","path":"/spec/gateway/wanPort","value":7480}]'
refuse "port on the gateway's HTTP port" "spec.gateway.port" "must not be 7480" \
    '[{"op":"add","path":"/spec/gateway/port","value":7480}]'
refuse "outerLearningRate 0" "spec.gateway.outerLearningRate" "greater than 0" \
    '[{"op":"replace","path":"/spec/gateway/outerLearningRate","value":0}]'
refuse "outerLearningRate above 10" "spec.gateway.outerLearningRate" "less than or equal to 10" \
    '[{"op":"replace","path":"/spec/gateway/outerLearningRate","value":10.5}]'
# (The API server prints the fractional maximum 0.999 as 0 in this message.)
refuse "outerMomentum 1" "spec.gateway.outerMomentum" "should be less than or equal to" \
    '[{"op":"replace","path":"/spec/gateway/outerMomentum","value":1}]'
refuse "outerMomentum above 0.999 (the trainer's largest)" "spec.gateway.outerMomentum" "should be less than or equal to" \
    '[{"op":"replace","path":"/spec/gateway/outerMomentum","value":0.9995}]'
refuse "negative outerMomentum" "spec.gateway.outerMomentum" "greater than or equal to 0" \
    '[{"op":"replace","path":"/spec/gateway/outerMomentum","value":-0.5}]'
refuse "gangScheduling a string" "spec.gangScheduling" "must be of type boolean" \
    '[{"op":"add","path":"/spec/gangScheduling","value":"yes"}]'
refuse "successPolicy.operator Some" "spec.successPolicy.operator" "Unsupported value" \
    '[{"op":"add","path":"/spec/successPolicy","value":{"operator":"Some"}}]'
refuse "successPolicy.targetRegions naming no region" "spec.successPolicy.targetRegions" "must name regions of spec.regions that run clients" \
    '[{"op":"add","path":"/spec/successPolicy","value":{"targetRegions":["r9"]}}]'
refuse "successPolicy.targetRegions naming a region without clients" "spec.successPolicy.targetRegions" "must name regions of spec.regions that run clients" \
    '[{"op":"add","path":"/spec/successPolicy","value":{"targetRegions":["r2"]}},{"op":"add","path":"/spec/regions/1/clients","value":0}]'
refuse "successPolicy.targetRegions naming a region twice" "spec.successPolicy.targetRegions[1]" "Duplicate value" \
    '[{"op":"add","path":"/spec/successPolicy","value":{"targetRegions":["r1","r1"]}}]'
refuse "fragments 0" "spec.gateway.fragments" "greater than or equal to 1" \
    '[{"op":"add","path":"/spec/gateway/fragments","value":0}]'
refuse "fragments 9 (the trainer's most is 8)" "spec.gateway.fragments" "less than or equal to 8" \
    '[{"op":"add","path":"/spec/gateway/fragments","value":9}]'
refuse "more fragments than syncEvery" "spec.gateway.fragments" "must not exceed gateway.syncEvery" \
    '[{"op":"add","path":"/spec/gateway/fragments","value":4},{"op":"replace","path":"/spec/gateway/syncEvery","value":3}]'
refuse "two regions, one without a client" "spec.regions" "every region must run clients" \
    '[{"op":"replace","path":"/spec/regions/0/clients","value":0}]'
refuse "65 clients (the step barrier's most is 64)" "spec.regions[1].clients" "less than or equal to 64" \
    '[{"op":"replace","path":"/spec/regions/1/clients","value":65}]'
refuse "the old gateway.syncPeriod" 'unknown field "spec.gateway.syncPeriod"' "strict decoding error" \
    '[{"op":"add","path":"/spec/gateway/syncPeriod","value":"2m"}]'
refuse "bad service type" "spec.gateway.serviceType" 'Unsupported value: "ExternalName"' \
    '[{"op":"add","path":"/spec/gateway/serviceType","value":"ExternalName"}]'
refuse "peers.replicas above the upper bound" "spec.regions[0].peers.replicas" "less than or equal to 256" \
    '[{"op":"replace","path":"/spec/regions/0/peers/replicas","value":1000},{"op":"remove","path":"/spec/regions/0/peers/max"}]'
refuse "negative runPolicy.backoffLimit" "spec.runPolicy.backoffLimit" "greater than or equal to 0" \
    '[{"op":"replace","path":"/spec/runPolicy/backoffLimit","value":-1}]'
refuse "missing image" "spec.image" "Required value" \
    '[{"op":"remove","path":"/spec/image"}]'
refuse "no regions" "spec.regions" "at least 1 items" \
    '[{"op":"replace","path":"/spec/regions","value":[]}]'
refuse "no region runs clients" "spec.regions" "at least one region must run clients" \
    '[{"op":"replace","path":"/spec/regions/0/clients","value":0},{"op":"replace","path":"/spec/regions/1/clients","value":0}]'
refuse "nodeSelector picks another region" "spec.regions[0].placement.nodeSelector" "must not select a region other than" \
    '[{"op":"add","path":"/spec/regions/0/placement/nodeSelector/topology.kubernetes.io~1region","value":"r2"}]'
refuse "bad resource quantity" "spec.regions[0].resources.peer.requests.cpu" "should match" \
    '[{"op":"replace","path":"/spec/regions/0/resources/peer/requests/cpu","value":"lots"}]'
refuse "bad toleration operator" "spec.regions[0].placement.tolerations[0].operator" 'Unsupported value: "Maybe"' \
    '[{"op":"replace","path":"/spec/regions/0/placement/tolerations/0/operator","value":"Maybe"}]'
refuse "data.sequenceLength > the model's context" "spec.data.sequenceLength" "must not exceed the model's context" \
    '[{"op":"add","path":"/spec/data","value":{"sequenceLength":4096}}]'
refuse "misspelt field" 'unknown field "spec.regoins"' "strict decoding error" \
    '[{"op":"add","path":"/spec/regoins","value":[]}]'
refuse "job name over 35 characters" "metadata.name" "at most 35 characters" \
    '[{"op":"replace","path":"/metadata/name","value":"a-swarm-job-name-of-thirty-six-chars"}]'

# accept DESCRIPTION JSON-PATCH-OPS: the sample with the patch applied (as a new SwarmJob) is
# accepted by the API server (a server-side dry run: nothing is stored).
accept() {
    local out ops="[{\"op\":\"replace\",\"path\":\"/metadata/name\",\"value\":\"good-variant\"},${2#[}"
    if ! out=$(k patch --local -f "$sample" --type=json -p "$ops" -o yaml 2>&1); then
        not_ok "$1: bad test patch: $out"
    elif out=$(k apply -n "$NS" --dry-run=server -f - <<<"$out" 2>&1); then
        ok "accepted: $1"
    else
        not_ok "$1: refused: $out"
    fi
}
for codec in auto none fp16 q8 q8+zstd lowbit:2 lowbit:4+zstd topk:0.01 topk:1 topk:.5 topk:0.05:8 topk:0.001:16+zstd; do
    accept "codec $codec" "[{\"op\":\"replace\",\"path\":\"/spec/gateway/codec\",\"value\":\"$codec\"}]"
done
accept "outerMomentum 0, outerLearningRate 10, syncEvery 1, wanPort 443" \
    '[{"op":"replace","path":"/spec/gateway/outerMomentum","value":0},{"op":"replace","path":"/spec/gateway/outerLearningRate","value":10},{"op":"replace","path":"/spec/gateway/syncEvery","value":1},{"op":"add","path":"/spec/gateway/wanPort","value":443}]'
accept "successPolicy Any of region r2" \
    '[{"op":"add","path":"/spec/successPolicy","value":{"operator":"Any","targetRegions":["r2"]}}]'
accept "fragments 8 with syncEvery 8" \
    '[{"op":"add","path":"/spec/gateway/fragments","value":8},{"op":"replace","path":"/spec/gateway/syncEvery","value":8}]'
accept "one region with 3 clients (no outer steps)" \
    '[{"op":"remove","path":"/spec/regions/1"},{"op":"replace","path":"/spec/regions/0/clients","value":3}]'
accept "two regions, one with 2 clients (client 0 takes its outer steps)" \
    '[{"op":"replace","path":"/spec/regions/1/clients","value":2}]'

# ---- updates: immutable fields -----------------------------------------------------------------

# refuse_update DESCRIPTION FIELD MESSAGE-FRAGMENT JSON-PATCH-OPS: on the stored sample (on
# the stored SwarmJob $JOB when set).
refuse_update() {
    local what=$1 field=$2 frag=$3 ops=$4 out
    if out=$(k patch sj -n "$NS" "${JOB:-tiny-bible}" --type=json -p "$ops" 2>&1); then
        not_ok "$what: accepted"
    elif [[ "$out" == *"$field"* && "$out" == *"$frag"* ]]; then
        ok "refused: $what -> $(grep -F -m1 "$field" <<<"$out" | sed 's/^\* //; s/^The SwarmJob "[^"]*" is invalid: //')"
    else
        not_ok "$what: refused without naming $field / '$frag': $out"
    fi
}
refuse_update "model preset changed" "spec.model" "model is immutable" \
    '[{"op":"replace","path":"/spec/model/preset","value":"small"}]'
refuse_update "model width added" "spec.model" "model is immutable" \
    '[{"op":"add","path":"/spec/model/width","value":256}]'
refuse_update "pipeline.stages changed" "spec.pipeline.stages" "pipeline.stages is immutable" \
    '[{"op":"replace","path":"/spec/pipeline/stages","value":1}]'
refuse_update "region renamed" "spec.regions" "region names are immutable" \
    '[{"op":"replace","path":"/spec/regions/1/name","value":"r3"}]'
refuse_update "region added" "spec.regions" "region names are immutable" \
    '[{"op":"add","path":"/spec/regions/-","value":{"name":"r3"}}]'
# The same through kubectl apply of a changed file.
out=$(k patch --local -f "$sample" --type=json -p '[{"op":"replace","path":"/spec/pipeline/stages","value":4}]' -o yaml |
    k apply -n "$NS" -f - 2>&1)
if [[ $? -ne 0 && "$out" == *spec.pipeline.stages*immutable* ]]; then
    ok "kubectl apply with changed stages refused"
else
    not_ok "kubectl apply with changed stages: $out"
fi
check "scaling peers, suspending and changing the image are allowed" \
    k patch sj -n "$NS" tiny-bible --type=json -p '[{"op":"replace","path":"/spec/regions/0/peers/replicas","value":4},{"op":"replace","path":"/spec/suspend","value":true},{"op":"replace","path":"/spec/image","value":"cirrus:v2"}]'

# ---- regions in several clusters ----------------------------------------------------------------

# A home job: region r2 runs in the member cluster "east"; a copy as a home operator writes it
# into a member cluster: r1 runs in the home cluster, whose gateway is reached at an endpoint.
# plus OPS MORE-OPS: the two JSON patches as one.
plus() { printf '%s,%s' "${1%]}" "${2#[}"; }
home_ops='[{"op":"add","path":"/spec/regions/1/cluster","value":"east"},{"op":"add","path":"/spec/clusters","value":[{"name":"east","kubeconfigSecret":{"name":"east-kubeconfig"}}]},{"op":"add","path":"/spec/gateway/serviceType","value":"NodePort"}]'
copy_ops='[{"op":"add","path":"/spec/home","value":{"cluster":"home","uid":"abc"}},{"op":"add","path":"/spec/regions/0/cluster","value":"home"},{"op":"add","path":"/spec/regions/0/endpoint","value":"10.0.0.5:30443"},{"op":"add","path":"/spec/gateway/serviceType","value":"NodePort"}]'
accept "a region in member cluster east, NodePort gateways" "$home_ops"
accept "a copy in a member cluster (spec.home; r1 in the home cluster at 10.0.0.5:30443)" "$copy_ops"
accept "LoadBalancer gateways, two member clusters" \
    '[{"op":"add","path":"/spec/regions/0/cluster","value":"west"},{"op":"add","path":"/spec/regions/1/cluster","value":"east"},{"op":"add","path":"/spec/clusters","value":[{"name":"east","kubeconfigSecret":{"name":"east-kubeconfig","key":"config.yaml"}},{"name":"west","kubeconfigSecret":{"name":"west-kubeconfig"}}]},{"op":"add","path":"/spec/gateway/serviceType","value":"LoadBalancer"}]'
accept "ClusterIP gateways when every region has an endpoint (a DNS name, an IPv6 address)" \
    '[{"op":"add","path":"/spec/regions/1/cluster","value":"east"},{"op":"add","path":"/spec/clusters","value":[{"name":"east","kubeconfigSecret":{"name":"east-kubeconfig"}}]},{"op":"add","path":"/spec/regions/0/endpoint","value":"gw-r1.example.com:443"},{"op":"add","path":"/spec/regions/1/endpoint","value":"[fd00::1:5]:7443"}]'
accept "a copy whose home job Failed" \
    '[{"op":"add","path":"/spec/home","value":{"cluster":"home","uid":"0b6c1a8e-3f7d-4c61-9a57-2f4e8d1c0b9a","phase":"Failed"}},{"op":"add","path":"/spec/regions/0/cluster","value":"home"},{"op":"add","path":"/spec/regions/0/endpoint","value":"10.0.0.5:30443"},{"op":"add","path":"/spec/regions/1/endpoint","value":"10.1.0.7:31443"}]'
refuse "a region's cluster naming no entry of spec.clusters" "spec.regions" "regions[].cluster must name an entry of spec.clusters" \
    '[{"op":"add","path":"/spec/regions/0/cluster","value":"east"},{"op":"add","path":"/spec/regions/1/cluster","value":"west"},{"op":"add","path":"/spec/clusters","value":[{"name":"east","kubeconfigSecret":{"name":"east-kubeconfig"}}]},{"op":"add","path":"/spec/gateway/serviceType","value":"NodePort"}]'
refuse "a region's cluster without spec.clusters" "spec.regions" "regions[].cluster must name an entry of spec.clusters" \
    '[{"op":"add","path":"/spec/regions/1/cluster","value":"east"},{"op":"add","path":"/spec/gateway/serviceType","value":"NodePort"}]'
refuse "spec.clusters on a copy" "spec.clusters" "a copy of a job (spec.home set) has no spec.clusters" \
    "$(plus "$copy_ops" '[{"op":"add","path":"/spec/clusters","value":[{"name":"east","kubeconfigSecret":{"name":"east-kubeconfig"}}]}]')"
refuse "ClusterIP gateways with a region in another cluster and no endpoints" "spec.gateway.serviceType" \
    "gateway.serviceType must be NodePort or LoadBalancer when a region runs in another cluster" \
    '[{"op":"add","path":"/spec/regions/1/cluster","value":"east"},{"op":"add","path":"/spec/clusters","value":[{"name":"east","kubeconfigSecret":{"name":"east-kubeconfig"}}]}]'
refuse "explicit ClusterIP gateways with one region's endpoint missing" "spec.gateway.serviceType" \
    "gateway.serviceType must be NodePort or LoadBalancer when a region runs in another cluster" \
    "$(plus "$home_ops" '[{"op":"add","path":"/spec/regions/1/endpoint","value":"10.1.0.7:31443"},{"op":"replace","path":"/spec/gateway/serviceType","value":"ClusterIP"}]')"
refuse "a ClusterIP copy (its own region r2 has no endpoint)" "spec.gateway.serviceType" \
    "gateway.serviceType must be NodePort or LoadBalancer when a region runs in another cluster" \
    "$(plus "$copy_ops" '[{"op":"replace","path":"/spec/gateway/serviceType","value":"ClusterIP"}]')"
refuse "an entry of spec.clusters no region names" "spec.clusters" "every entry of spec.clusters must run some region" \
    "$(plus "$home_ops" '[{"op":"add","path":"/spec/clusters/-","value":{"name":"west","kubeconfigSecret":{"name":"west-kubeconfig"}}}]')"
refuse "spec.clusters with no region in another cluster" "spec.clusters" "every entry of spec.clusters must run some region" \
    '[{"op":"add","path":"/spec/clusters","value":[{"name":"east","kubeconfigSecret":{"name":"east-kubeconfig"}}]}]'
endpoint() { plus "$copy_ops" "[{\"op\":\"replace\",\"path\":\"/spec/regions/0/endpoint\",\"value\":\"$1\"}]"; }
refuse "endpoint without a port (host)" "spec.regions[0].endpoint" "should match" "$(endpoint host)"
refuse "endpoint a:b:c" "spec.regions[0].endpoint" "should match" "$(endpoint a:b:c)"
refuse "endpoint an IPv6 address without brackets" "spec.regions[0].endpoint" "should match" "$(endpoint fd00::1:7443)"
refuse "endpoint port 0" "spec.regions[0].endpoint" "the endpoint's port must be 1 to 65535" "$(endpoint 10.0.0.5:0)"
refuse "endpoint port 65536" "spec.regions[0].endpoint" "the endpoint's port must be 1 to 65535" "$(endpoint '[fd00::1]:65536')"
refuse "home.phase Running" "spec.home.phase" 'Unsupported value: "Running"' \
    "$(plus "$copy_ops" '[{"op":"add","path":"/spec/home/phase","value":"Running"}]')"
refuse "home without uid" "spec.home.uid" "Required value" \
    "$(plus "$copy_ops" '[{"op":"remove","path":"/spec/home/uid"}]')"
refuse "home.uid over 64 characters" "spec.home.uid" "Too long" \
    "$(plus "$copy_ops" "[{\"op\":\"replace\",\"path\":\"/spec/home/uid\",\"value\":\"$(printf '%065d' 1)\"}]")"
refuse "home.uid with a comma" "spec.home.uid" "should match" \
    "$(plus "$copy_ops" '[{"op":"replace","path":"/spec/home/uid","value":"abc,def"}]')"
refuse "home.cluster not a DNS label" "spec.home.cluster" "must be a DNS label" \
    "$(plus "$copy_ops" '[{"op":"replace","path":"/spec/home/cluster","value":"Home_1"}]')"
refuse "a region's cluster not a DNS label" "spec.regions[1].cluster" "must be a DNS label" \
    '[{"op":"add","path":"/spec/regions/1/cluster","value":"East.1"},{"op":"add","path":"/spec/clusters","value":[{"name":"East.1","kubeconfigSecret":{"name":"east-kubeconfig"}}]},{"op":"add","path":"/spec/gateway/serviceType","value":"NodePort"}]'
refuse "a cluster's name over 63 characters" "spec.clusters[0].name" "Too long" \
    "$(plus "$home_ops" "[{\"op\":\"replace\",\"path\":\"/spec/clusters/0/name\",\"value\":\"$(printf 'e%.0s' {1..64})\"}]")"
refuse "a cluster without kubeconfigSecret" "spec.clusters[0].kubeconfigSecret" "Required value" \
    "$(plus "$home_ops" '[{"op":"remove","path":"/spec/clusters/0/kubeconfigSecret"}]')"
refuse "two clusters of one name" "spec.clusters[1]" "Duplicate value" \
    "$(plus "$home_ops" '[{"op":"add","path":"/spec/clusters/-","value":{"name":"east","kubeconfigSecret":{"name":"other"}}}]')"
refuse "a kubeconfig Secret's key with a slash" "spec.clusters[0].kubeconfigSecret.key" "should match" \
    "$(plus "$home_ops" '[{"op":"add","path":"/spec/clusters/0/kubeconfigSecret/key","value":"a/b"}]')"

# Stored: the home job and the copy, for their defaults, updates and status.
store() { # NAME JSON-PATCH-OPS: the sample named NAME with the patch applied, created
    k patch --local -f "$sample" --type=json -o yaml \
        -p "[{\"op\":\"replace\",\"path\":\"/metadata/name\",\"value\":\"$1\"},${2#[}" | k apply -n "$NS" -f -
}
check "home job with a region in member cluster east stored" store home-job "$home_ops"
check "copy stored" store copy-job "$copy_ops"
expect_eq "home job: clusters[0] name, kubeconfigSecret name and default key" "east east-kubeconfig kubeconfig" \
    "$(sj_get home-job '.spec.clusters[0].name} {.spec.clusters[0].kubeconfigSecret.name} {.spec.clusters[0].kubeconfigSecret.key')"
expect_eq "home job: regions' clusters, serviceType" "east NodePort" \
    "$(sj_get home-job '.spec.regions[*].cluster} {.spec.gateway.serviceType')"
expect_eq "copy: home, r1's cluster and endpoint" "home abc home 10.0.0.5:30443" \
    "$(sj_get copy-job '.spec.home.cluster} {.spec.home.uid} {.spec.regions[0].cluster} {.spec.regions[0].endpoint')"
JOB=home-job refuse_update "a region's cluster changed" "spec.regions[1].cluster" "regions[].cluster is immutable" \
    '[{"op":"replace","path":"/spec/regions/1/cluster","value":"west"},{"op":"replace","path":"/spec/clusters/0/name","value":"west"}]'
JOB=home-job refuse_update "a region's cluster added" "spec.regions[0].cluster" "regions[].cluster is immutable" \
    '[{"op":"add","path":"/spec/regions/0/cluster","value":"east"}]'
JOB=home-job refuse_update "a region's cluster removed" "spec.regions[1].cluster" "regions[].cluster is immutable" \
    '[{"op":"remove","path":"/spec/regions/1/cluster"},{"op":"remove","path":"/spec/clusters"}]'
JOB=home-job refuse_update "home added to a job" "spec.home" "home cannot be added or removed" \
    '[{"op":"remove","path":"/spec/clusters"},{"op":"add","path":"/spec/home","value":{"cluster":"east","uid":"abc"}}]'
JOB=copy-job refuse_update "home removed from a copy" "spec.home" "home cannot be added or removed" \
    '[{"op":"remove","path":"/spec/home"},{"op":"remove","path":"/spec/regions/0/endpoint"}]'
JOB=copy-job refuse_update "home.uid changed" "spec.home" "home.cluster and home.uid are immutable" \
    '[{"op":"replace","path":"/spec/home/uid","value":"xyz"}]'
JOB=copy-job refuse_update "home.cluster changed" "spec.home" "home.cluster and home.uid are immutable" \
    '[{"op":"replace","path":"/spec/home/cluster","value":"other"}]'
check "copy: the home job's final phase and a new endpoint may be set" \
    k patch sj -n "$NS" copy-job --type=json -p '[{"op":"add","path":"/spec/home/phase","value":"Succeeded"},{"op":"replace","path":"/spec/regions/0/endpoint","value":"lb.example.com:7443"}]'
check "home job: another kubeconfig Secret may be named" \
    k patch sj -n "$NS" home-job --type=json -p '[{"op":"replace","path":"/spec/clusters/0/kubeconfigSecret","value":{"name":"east-kubeconfig-2","key":"config"}}]'
status='{"status":{"phase":"Running","conditions":[{"type":"ClustersReachable","status":"False","reason":"MemberUnreachable","message":"east: connection refused","lastTransitionTime":"2026-01-02T03:04:05Z"}],
  "regions":[{"name":"r1","endpoint":"10.0.0.5:30443","clientsSucceeded":0},{"name":"r2","cluster":"east","endpoint":"10.1.0.7:31443","clusterReachable":false,"clientsSucceeded":1,"step":40}]}}'
check "operator ServiceAccount writes a home job's status (regions' cluster, endpoint, clusterReachable, clientsSucceeded)" \
    k --as="$SA" patch sj -n "$NS" home-job --subresource=status --type=merge -p "$status"
expect_eq "status.regions[*]: cluster, endpoints, clusterReachable, clientsSucceeded" \
    "east 10.0.0.5:30443 10.1.0.7:31443 false 0 1" \
    "$(sj_get home-job '.status.regions[*].cluster} {.status.regions[*].endpoint} {.status.regions[*].clusterReachable} {.status.regions[*].clientsSucceeded')"
out=$(k --as="$SA" patch sj -n "$NS" home-job --subresource=status --type=json -p '[{"op":"replace","path":"/status/regions/1/clientsSucceeded","value":-1}]' 2>&1)
if [[ $? -ne 0 && "$out" == *regions*clientsSucceeded*"greater than or equal to 0"* ]]; then
    ok "negative status.regions[].clientsSucceeded refused"
else
    not_ok "status.regions[1].clientsSucceeded -1: $out"
fi

# ---- RBAC of the operator's ServiceAccount --------------------------------------------------

can() { # VERB RESOURCE [kubectl auth can-i flags...]
    local verb=$1 res=$2; shift 2
    check "operator can $verb $res $*" k auth can-i "$verb" "$res" --as="$SA" "$@"
}
cannot() {
    local verb=$1 res=$2; shift 2
    check_not "operator cannot $verb $res $*" k auth can-i "$verb" "$res" --as="$SA" "$@"
}
for v in get list watch; do can "$v" swarmjobs.cirrus.dev -A; done
for v in list watch; do can "$v" nodes; done
can update swarmjobs.cirrus.dev --subresource=status -n "$NS"
can patch swarmjobs.cirrus.dev --subresource=status -n "$NS"
can update swarmjobs.cirrus.dev --subresource=finalizers -n "$NS"
for r in pods services; do
    for v in create get list watch update patch delete; do can "$v" "$r" -n "$NS"; done
done
can create secrets -n "$NS"
can get secrets -n "$NS"
can patch secrets -n "$NS" # gateway certificates added to a job's Secret (controller_pki.c)
# A job's Secret is asked for by name: the operator cannot enumerate, replace or delete Secrets.
for v in list watch update delete; do cannot "$v" secrets -n "$NS"; done
cannot list secrets -A
# spec.gangScheduling's PodGroups: made, asked for, made again; nothing more.
for v in create get delete; do can "$v" podgroups.scheduling.k8s.io -n "$NS"; done
for v in list update patch; do cannot "$v" podgroups.scheduling.k8s.io -n "$NS"; done
can create events -n "$NS"
can patch events.events.k8s.io -n "$NS"
can create leases.coordination.k8s.io -n cirrus-system
can get leases.coordination.k8s.io/cirrus-operator -n cirrus-system
can update leases.coordination.k8s.io/cirrus-operator -n cirrus-system
cannot create swarmjobs.cirrus.dev -n "$NS"
cannot update swarmjobs.cirrus.dev -n "$NS"
can delete swarmjobs.cirrus.dev -n "$NS" # ttlSecondsAfterFinished
can patch swarmjobs.cirrus.dev -n "$NS"  # the finalizer cirrus.dev/member-copies
cannot deletecollection swarmjobs.cirrus.dev -n "$NS"
cannot delete namespaces
cannot create clusterroles.rbac.authorization.k8s.io
cannot create clusterrolebindings.rbac.authorization.k8s.io
cannot create rolebindings.rbac.authorization.k8s.io -n "$NS"
cannot escalate clusterroles.rbac.authorization.k8s.io
cannot delete nodes
cannot patch nodes
cannot delete customresourcedefinitions.apiextensions.k8s.io
cannot create deployments.apps -n "$NS"
cannot get configmaps -n "$NS"
cannot create pods --subresource=exec -n "$NS"
cannot create serviceaccounts --subresource=token -n "$NS"
cannot deletecollection pods -n "$NS"
cannot create leases.coordination.k8s.io -n default
cannot get leases.coordination.k8s.io/kube-controller-manager -n kube-system
cannot update leases.coordination.k8s.io/some-other-lease -n cirrus-system

# ---- the chart's memberAccess: a home cluster's operator in this cluster -----------------------

# Rendered from the chart under names of this test's own (removed at exit), once cluster-wide
# and once in $NS only, and used as helm/cirrus/values.yaml tells the platform team: a token
# of the ServiceAccount in a kubeconfig of its own, everything inline.
if ! HELM=$("$root/tests/operator/helm_install.sh"); then
    not_ok "installing helm (tests/operator/helm_install.sh)"
else
    member_access() { # FULLNAME [HELM-FLAGS...]: applies the chart's memberAccess objects
        "$HELM" template cirrus "$root/helm/cirrus" --namespace cirrus-system --show-only templates/member-access.yaml \
            --set memberAccess.create=true --set fullnameOverride="$1" "${@:2}" | k apply -f -
    }
    HOME_SA=system:serviceaccount:cirrus-system:$MEMBER_ALL-home
    check "memberAccess cluster-wide applied (ServiceAccount, ClusterRole, ClusterRoleBinding)" member_access "$MEMBER_ALL"
    for v in create get patch delete; do
        check "memberAccess: may $v swarmjobs" k auth can-i "$v" swarmjobs.cirrus.dev -n "$NS" --as="$HOME_SA"
    done
    check "memberAccess: may patch swarmjobs' status (status.home)" k auth can-i patch swarmjobs.cirrus.dev --subresource=status -n "$NS" --as="$HOME_SA"
    for a in "list swarmjobs.cirrus.dev" "watch swarmjobs.cirrus.dev" "update swarmjobs.cirrus.dev" \
        "update swarmjobs.cirrus.dev --subresource=status" "get secrets" "create secrets" "list secrets" \
        "update secrets" "delete secrets" \
        "create pods" "create services" "get nodes"; do
        # shellcheck disable=SC2086  # the verb, the resource and a flag
        check_not "memberAccess: may not $a" k auth can-i $a -n "$NS" --as="$HOME_SA"
    done
    kc=$(mktemp)
    km() { kubectl --kubeconfig "$kc" "$@"; }
    if token=$(k -n cirrus-system create token "$MEMBER_ALL-home" --duration=10m) &&
        km config set-cluster member --server="$CIRRUS_APISERVER" --certificate-authority="$CIRRUS_CA_FILE" --embed-certs >/dev/null &&
        km config set-credentials home --token="$token" >/dev/null &&
        km config set-context member --cluster=member --user=home >/dev/null &&
        km config use-context member >/dev/null; then
        ok "a kubeconfig for memberAccess's ServiceAccount made as values.yaml tells"
    else
        not_ok "making a kubeconfig for memberAccess's ServiceAccount"
    fi
    if grep -q 'certificate-authority-data:' "$kc" && grep -q 'token:' "$kc" && ! grep -qE '^ *(certificate-authority|client-certificate|client-key|tokenFile): ' "$kc"; then
        ok "that kubeconfig carries its CA and token inline (no file paths)"
    else
        not_ok "kubeconfig not all inline: $(sed 's/token: .*/token: .../' "$kc")"
    fi
    copy=$(k patch --local -f "$sample" --type=json -o yaml \
        -p "$(plus '[{"op":"replace","path":"/metadata/name","value":"member-copy"}]' "$copy_ops")")
    check "through it: a copy of a job created" km create -n "$NS" -f - <<<"$copy"
    check "through it: the copy patched (the home job's final phase)" \
        km patch sj -n "$NS" member-copy --type=merge -p '{"spec":{"home":{"phase":"Succeeded"}}}'
    expect_eq "through it: the copy read" "abc Succeeded" \
        "$(km get sj -n "$NS" member-copy -o jsonpath='{.spec.home.uid} {.spec.home.phase}' 2>&1)"
    # No Secret at all: the member's gateway keys are made there by its own operator.
    check_not "through it: no Secret created" \
        km create secret generic -n "$NS" member-copy-certs --from-literal=r2.key=KEY
    check_not "through it: no Secret read" km get secret -n "$NS" member-copy-certs
    check_not "through it: Secrets not listed" km get secrets -n "$NS"
    check_not "through it: SwarmJobs not listed" km get sj -n "$NS"
    check_not "through it: the copy's status not written" \
        km patch sj -n "$NS" member-copy --subresource=status --type=merge -p '{"status":{"phase":"Running"}}'
    check "through it: the copy deleted" km delete sj -n "$NS" member-copy --wait=false
    rm -f "$kc"

    HOME_SA=system:serviceaccount:cirrus-system:$MEMBER_NS-home
    check "memberAccess in namespace $NS applied (Role, RoleBinding)" \
        member_access "$MEMBER_NS" --set memberAccess.namespace="$NS"
    expect_eq "memberAccess in $NS: a Role and its binding there" "$MEMBER_NS-home $MEMBER_NS-home" \
        "$(k -n "$NS" get role,rolebinding -l app.kubernetes.io/instance=cirrus -o jsonpath='{.items[*].metadata.name}' 2>&1)"
    check "memberAccess in $NS: may create swarmjobs there" k auth can-i create swarmjobs.cirrus.dev -n "$NS" --as="$HOME_SA"
    check_not "memberAccess in $NS: no Secrets there either" k auth can-i get secrets -n "$NS" --as="$HOME_SA"
    check_not "memberAccess in $NS: not in default" k auth can-i create swarmjobs.cirrus.dev -n default --as="$HOME_SA"
    check_not "memberAccess in $NS: no ClusterRole" k get clusterrole "$MEMBER_NS-home"
fi

checks_summary crd
exit
