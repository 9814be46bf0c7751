/* cache_slim: what the operator's caches keep of each object (its informers' transform,
 * client-go's TransformFunc), pruned in place: the caches are most of the operator's memory.
 *
 * Every object drops metadata.managedFields (often the largest part of a pod). A pod keeps
 * its name, namespace, uid, resourceVersion, labels, annotations and deletionTimestamp,
 * spec.nodeName, and what podstate.c and failpolicy.c read of its status: phase, reason,
 * message, the conditions' type/status/reason/message, the containers' name, ready, state
 * and lastState. A field read there must be kept here (tests/operator/test_podstate.c
 * classifies every pod both whole and slimmed). A node keeps its metadata and spec; a
 * Service or Secret only its metadata (the controller only asks whether one exists: the
 * job Secret's keys are not held in the operator's memory); a SwarmJob all but
 * managedFields and kubectl's last-applied-configuration annotation (a second copy of the
 * spec). Pods and SwarmJobs are then cached as text (informer.h: compact).
 */
#ifndef CIRRUS_OPERATOR_CACHE_SLIM_H
#define CIRRUS_OPERATOR_CACHE_SLIM_H

#include <jansson.h>

void cache_slim_job(json_t *job);
void cache_slim_pod(json_t *pod);
void cache_slim_node(json_t *node);
void cache_slim_to_metadata(json_t *obj);

#endif
