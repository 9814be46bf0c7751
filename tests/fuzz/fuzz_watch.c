/* fuzz_watch: the operator's watch-stream decoder (operator/kube/watch.c), fed the body of
 * a `?watch=1` response as the API server streams it: newline-delimited JSON events.
 *
 * The stream is cut into lines and each line trimmed as the watch's dispatcher does, then
 * decoded by kube_watch_parse_event; ERROR events go through kube_watch_error_status.
 * Invariants: a refused line yields no object; an accepted one is a JSON object with one of
 * the five event types, owned by the caller (a missing or extra reference shows up as a
 * leak or a use after free); an ERROR event never maps to success; decode(encode(x)) == x:
 * the event written back as {"type":..,"object":..} decodes to the same type and object.
 */
#include "fuzz.h"

#include <jansson.h>

#include "../../operator/kube/watch.h"

static const char *const type_names[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"};

static void one_line(const char *line, size_t len)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' ')) len--;
    if (len == 0) return;
    enum kube_event_type type = (enum kube_event_type)-1;
    json_t *obj = (json_t *)1;
    cirrus_error err;
    int rc = kube_watch_parse_event(line, len, &type, &obj, &err);
    if (rc != 0) {
        FUZZ_CHECK(rc == CIRRUS_ECORRUPT && obj == NULL, "refused line: rc %d, object %p", rc, (void *)obj);
        return;
    }
    FUZZ_CHECK((unsigned)type <= KUBE_EVENT_ERROR, "event type %d", (int)type);
    FUZZ_CHECK(json_is_object(obj), "event object is not an object");
    if (type == KUBE_EVENT_ERROR) {
        int st = kube_watch_error_status(obj, &err);
        FUZZ_CHECK(st < 0, "ERROR event mapped to %d", st);
        FUZZ_CHECK(memchr(err.msg, '\0', sizeof err.msg) != NULL, "message not terminated");
    }
    json_t *ev = json_pack("{s:s, s:O}", "type", type_names[type], "object", obj);
    char *text = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    FUZZ_CHECK(text, "cannot re-encode the event");
    enum kube_event_type type2;
    json_t *obj2;
    FUZZ_CHECK(kube_watch_parse_event(text, strlen(text), &type2, &obj2, &err) == 0,
               "re-encoded event refused: %s", err.msg);
    FUZZ_CHECK(type2 == type && json_equal(obj, obj2), "event differs after a round trip");
    json_decref(obj2);
    free(text);
    json_decref(ev);
    json_decref(obj);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    size_t off = 0;
    while (off < size) {
        const char *nl = memchr(s + off, '\n', size - off);
        size_t n = nl ? (size_t)(nl - (s + off)) : size - off; /* the last line may lack its newline */
        one_line(s + off, n);
        off += n + 1;
    }
    return 0;
}
