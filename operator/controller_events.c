/* controller_events: the Events the controller records on its jobs (controller_internal.h).
 * An Event is an aid to people, never something the controller waits on: each is logged at
 * once and sent after its reconcile with the others of that reconcile, concurrently over the
 * client's connection. A reconcile that finds 100 peers gone and replaces them used to send
 * 100 POSTs one after another before its next key. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "../common/log.h"
#include "controller_internal.h"

/* Events held before a flush at most: past it, sent at once (a reconcile of a very large
 * job), so that memory stays bounded. */
#define EVENTS_PENDING_MAX 256

void ctl_event(controller *ctl, const json_t *job, int warning, const char *reason,
               const char *fmt, ...)
{
    char msg[1024], now[32], path[PATH_MAX_LEN], gen[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_info("%s/%s: %s: %s", meta_str(job, "namespace"), meta_str(job, "name"), reason, msg);
    jobstatus_now(now, sizeof now);
    snprintf(gen, sizeof gen, "%s.", meta_str(job, "name"));
    if (child_path(path, job, "events", NULL)) return;
    json_t *ev = json_pack(
        "{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:s, s:s, s:s, s:s}, s:s, s:s, s:s, s:s, s:s, s:i,"
        " s:{s:s}, s:s, s:s}",
        "apiVersion", "v1", "kind", "Event", "metadata", "generateName", gen, "namespace",
        meta_str(job, "namespace"), "involvedObject", "apiVersion", CIRRUS_API_VERSION, "kind",
        CIRRUS_KIND, "name", meta_str(job, "name"), "namespace", meta_str(job, "namespace"),
        "uid", meta_str(job, "uid"), "reason", reason, "message", msg, "type",
        warning ? "Warning" : "Normal", "firstTimestamp", now, "lastTimestamp", now, "count", 1,
        "source", "component", "cirrus-operator", "reportingComponent", "cirrus-operator",
        "reportingInstance", ctl->identity);
    json_t *entry = ev ? json_pack("{s:s, s:o}", "path", path, "event", ev) : NULL;
    if (!entry || json_array_append_new(ctl->events, entry)) {
        log_warn("event %s for %s not recorded: out of memory", reason, meta_str(job, "name"));
        return;
    }
    if (json_array_size(ctl->events) >= EVENTS_PENDING_MAX) ctl_flush_events(ctl);
}

void ctl_flush_events(controller *ctl)
{
    const size_t n = json_array_size(ctl->events);
    if (n == 0) return;
    kube_call *calls = calloc(n, sizeof *calls);
    if (calls) {
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(ctl->events, i);
            calls[i] = (kube_call){.method = "POST",
                                   .path = json_string_value(json_object_get(e, "path")),
                                   .body = json_object_get(e, "event")};
        }
        kube_request_all(ctl->client, calls, n);
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *ev = json_object_get(json_array_get(ctl->events, i), "event");
        const int rc = calls ? calls[i].rc : CIRRUS_ENOMEM;
        if (!rc) {
            ctl->stats.events++;
            continue;
        }
        log_warn("event %s for %s not recorded: %s",
                 json_string_value(json_object_get(ev, "reason")),
                 json_string_value(json_object_get(json_object_get(ev, "involvedObject"), "name")),
                 calls ? calls[i].err.msg : "out of memory");
    }
    free(calls);
    json_array_clear(ctl->events);
}
