/* snapshot: freeing a coordinator's state copy. See snapshot.h. */
#include "snapshot.h"

#include <stdlib.h>
#include <string.h>

void coord_snapshot_free(coord_snapshot *s)
{
    free(s->stage_peers);
    free(s->stage_throughput);
    free(s->stage_capacity);
    free(s->members);
    memset(s, 0, sizeof *s);
}
