#!/usr/bin/env bash
# A finished job's status shows how its clients ended, not the gateway's last /status, against
# the real control plane (run by run.sh with KUBECONFIG set and kubectl on PATH). The defect:
# the operator reads the region gateways every 10 s, and they are deleted when the job
# succeeds, so a job of 300 steps ended Succeeded at "step 295". Each client now writes a
# summary of how it ended to its termination message (--summary-file /dev/termination-log)
# and the operator reads it from client 0's finished pod. kwok runs no containers: a fake
# gateway (python3, on 127.0.0.1:7480, which --resolve maps the gateways' Service names to)
# answers /status with step 295, and a client's end is what its status says, set here
# through the API as a kubelet would:
#   * the client pods run `--summary-file /dev/termination-log`, terminationMessagePolicy FallbackToLogsOnError;
#   * while running, both jobs show the gateway's step 295;
#   * `good`'s client exits 0 with {"step":300,"loss":1.875,"val_loss":2.25,...}: the job is
#     Succeeded with step 300, loss 1.875 and regions[0].validationLoss 2.25;
#   * `bad`'s client exits 0 with step 301 (past spec.steps): Succeeded, the message is not
#     trusted (step stays 295, no validationLoss) and the log says why, once for the pod.
# Skipped (exit 0, with a message) when port 7480 is taken. Last line: "summary: N passed,
# N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
GW_PORT=7480 # ROLE_PORT_HTTP (common/role_args.h): the port of the gateway Service's /status
if (exec 3<>"/dev/tcp/127.0.0.1/$GW_PORT") 2>/dev/null; then
    echo "summary: skipped: port $GW_PORT on 127.0.0.1 is in use, and the fake gateway must listen there"
    checks_summary summary
    exit 0
fi
focused_test_begin summary cirrus-summary-test

# The fake gateways: /status of the job named by the Host header (JOB-r1-gw.NS.svc), whose
# uid is in $work/uid-JOB once the job exists; 404 until then.
cat >"$work/gateway.py" <<'PY'
import http.server, json, os, sys
work = sys.argv[1]
class Gateway(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        job = self.headers.get("Host", "").split("-r1-gw.")[0]
        path = os.path.join(work, "uid-" + job)
        if self.path != "/status" or not os.path.exists(path):
            self.send_error(404)
            return
        body = json.dumps({"job_id": open(path).read().strip(), "step": 295, "loss": 2.5,
                           "tokens_per_s": 1000}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Gateway).serve_forever()
PY
python3 "$work/gateway.py" "$work" "$GW_PORT" 2>"$work/gateway.log" &
gw_pid=$!
trap 'kill "$gw_pid" 2>/dev/null; focused_cleanup' EXIT
poll_until 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$GW_PORT" || fail_fast "the fake gateway did not listen"
test_operator_start "$work" "$NS" --progress-period-s 1 \
    --resolve "good-r1-gw.$NS.svc:$GW_PORT:127.0.0.1,bad-r1-gw.$NS.svc:$GW_PORT:127.0.0.1" ||
    fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

for j in good bad; do
    kn apply -f - >/dev/null <<EOF || fail_fast "apply job $j"
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: $j}
spec:
  image: cirrus:latest
  steps: 300
  regions: [{name: r1, peers: {replicas: 1, min: 1}, clients: 1}]
EOF
    kn get sj "$j" -o jsonpath='{.metadata.uid}' >"$work/uid-$j" || fail_fast "uid of $j"
done
status() { kn get sj "$1" -o jsonpath="{.status.$2}" 2>/dev/null; }
status_is() { [[ "$(status "$1" "$2")" == "$3" ]]; }
region_figures() { # JOB: "STEP LOSS VALIDATIONLOSS" of its region r1
    kn get sj "$1" -o jsonpath='{.status.regions[0].step} {.status.regions[0].loss} {.status.regions[0].validationLoss}'
}

# ---- the client pods write their summary where the kubelet reads it --------------------------
client_made() { kn get pod good-r1-c0 >/dev/null 2>&1; }
poll_until 30 client_made || fail_fast "good-r1-c0 not made"
args=$(kn get pod good-r1-c0 -o jsonpath='{.spec.containers[0].args}')
check "the client runs --summary-file /dev/termination-log" grep -q '"--summary-file","/dev/termination-log"' <<<"$args"
expect_eq "its termination message path and policy" "/dev/termination-log FallbackToLogsOnError" \
    "$(kn get pod good-r1-c0 -o jsonpath='{.spec.containers[0].terminationMessagePath} {.spec.containers[0].terminationMessagePolicy}')"

# ---- while running: the gateway's figures ------------------------------------------------------
for j in good bad; do
    if poll_until 60 status_is "$j" step 295; then
        ok "$j: step 295 from its gateway while running"
    else
        fail_fast "$j: step is '$(status "$j" step)', want 295 (phase $(status "$j" phase))"
    fi
done

# finish_client POD MESSAGE: the client exits 0 with MESSAGE as its termination message.
finish_client() {
    local patch
    patch=$(jq -cn --arg m "$2" '{status: {phase: "Succeeded", containerStatuses: [{name: "trainer",
        image: "cirrus:latest", imageID: "", ready: false, restartCount: 0,
        state: {terminated: {exitCode: 0, reason: "Completed", message: $m}}}]}}') &&
        kn patch pod "$1" --subresource=status --type=merge -p "$patch" >/dev/null
}

# ---- a good summary: the final figures ---------------------------------------------------------
finish_client good-r1-c0 '{"step":300,"loss":1.875,"val_loss":2.25,"tokens":76800}
' || not_ok "patch good-r1-c0's status"
check "good: Succeeded once its client finished" poll_until 30 status_is good phase Succeeded
check "good: the job's step is the summary's, 300" poll_until 10 status_is good step 300
expect_eq "good: region r1 step loss validationLoss" "300 1.875 2.25" \
    "$(region_figures good)"
expect_eq "good: the job's loss" "1.875" "$(status good loss)"

# ---- a summary out of range: not trusted ------------------------------------------------------
finish_client bad-r1-c0 '{"step":301,"loss":0.5,"val_loss":0.5,"tokens":1}' || not_ok "patch bad-r1-c0's status"
check "bad: Succeeded once its client finished" poll_until 30 status_is bad phase Succeeded
check "bad: the log says why the summary was ignored" poll_until 10 grep -q \
    "pod bad-r1-c0 finished, its summary ignored .*summary step 301 is not in \[0, 300\]" "$work/operator.log"
expect_eq "bad: the gateway's step and loss stay, no validationLoss" "295 2.5 " \
    "$(region_figures bad)"
# More reconciles of the finished job (its pod and the job changed): still logged only once.
kn label pod bad-r1-c0 cirrus.dev/test=poke >/dev/null
kn annotate sj bad cirrus.dev/test=poke >/dev/null
sleep 2
expect_eq "bad: the ignored summary logged once for the pod" 1 \
    "$(grep -c "pod bad-r1-c0 finished, its summary ignored" "$work/operator.log")"
expect_eq "good: no summary of it ignored" 0 "$(grep -c "pod good-r1-c0 finished, its summary ignored" "$work/operator.log")"

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
