/* fuzz_lease: the leader elector's reading of a coordination.k8s.io/v1 Lease as the API
 * server returns it (operator/kube/lease.c: kube_lease_record, kube_lease_record_valid_ms),
 * the record it then writes back over it.
 *
 * Input: a Lease as JSON. Invariants: the validity is at least our lease duration and at
 * most a year; the record written keeps the server's metadata (resourceVersion included)
 * and every field of spec but the five it sets; holderIdentity is ours ("" on release),
 * leaseDurationSeconds ours (1 on release), leaseTransitions in [0, INT32_MAX], kept on a
 * renewal or a release and one more on a takeover (never past INT32_MAX); acquireTime kept
 * on a renewal; the server's object is not modified.
 */
#include "fuzz.h"

#include <jansson.h>

#include "../../operator/kube/lease.h"

#define ME "cirrus-operator-0"
#define LEASE_MS 15000

static void check(const json_t *base, int release)
{
    json_t *copy = json_deep_copy(base);
    json_t *rec = kube_lease_record(base, "ns", "lease", ME, LEASE_MS, release);
    FUZZ_CHECK(rec, "no record");
    FUZZ_CHECK(json_equal(base, copy), "the server's Lease was modified");
    const json_t *spec = json_object_get(rec, "spec"), *bspec = json_object_get(base, "spec");
    FUZZ_CHECK(json_is_object(spec), "record without spec");
    const json_t *meta = json_object_get(base, "metadata");
    FUZZ_CHECK(meta ? json_equal(json_object_get(rec, "metadata"), meta) : !json_object_get(rec, "metadata"),
               "metadata not kept");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)bspec, key, v) {
        if (!json_is_object(bspec)) break;
        if (!strcmp(key, "holderIdentity") || !strcmp(key, "leaseDurationSeconds") ||
            !strcmp(key, "acquireTime") || !strcmp(key, "renewTime") || !strcmp(key, "leaseTransitions"))
            continue;
        FUZZ_CHECK(json_equal(v, json_object_get(spec, key)), "spec.%s not kept", key);
    }
    const char *holder = json_string_value(json_object_get(spec, "holderIdentity"));
    FUZZ_CHECK(holder && !strcmp(holder, release ? "" : ME), "holder %s", holder ? holder : "(none)");
    json_int_t dur = json_integer_value(json_object_get(spec, "leaseDurationSeconds"));
    FUZZ_CHECK(dur == (release ? 1 : (LEASE_MS + 999) / 1000), "duration %lld", (long long)dur);
    const json_t *tj = json_object_get(spec, "leaseTransitions");
    FUZZ_CHECK(json_is_integer(tj), "leaseTransitions not an integer");
    json_int_t t = json_integer_value(tj);
    FUZZ_CHECK(t >= 0 && t <= INT32_MAX, "leaseTransitions %lld", (long long)t);
    json_int_t old = json_integer_value(json_object_get(bspec, "leaseTransitions"));
    old = old < 0 ? 0 : old > INT32_MAX ? INT32_MAX : old;
    const char *bholder = json_string_value(json_object_get(bspec, "holderIdentity"));
    int ours = bholder && !strcmp(bholder, ME);
    json_int_t want = release || ours || old == INT32_MAX ? old : old + 1;
    FUZZ_CHECK(t == want, "leaseTransitions %lld, want %lld", (long long)t, (long long)want);
    const char *acq = json_string_value(json_object_get(bspec, "acquireTime"));
    if (ours && !release && acq)
        FUZZ_CHECK(!strcmp(acq, json_string_value(json_object_get(spec, "acquireTime"))), "acquireTime not kept");
    json_decref(rec);
    json_decref(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *lease = json_loadb((const char *)data, size, 0, NULL);
    if (!lease) return 0;
    int64_t valid = kube_lease_record_valid_ms(lease, LEASE_MS);
    FUZZ_CHECK(valid >= LEASE_MS && valid < 86400LL * 365 * 1000, "valid for %lld ms", (long long)valid);
    if (json_is_object(lease)) {
        check(lease, 0);
        check(lease, 1);
    }
    json_decref(lease);
    return 0;
}
