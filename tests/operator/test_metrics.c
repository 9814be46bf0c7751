/* metrics: /healthz fails once the event loop stops turning (issue 13, item 9: it used to
 * answer 200 whatever the loop did), and the API request counters are rendered. */
#include <string.h>

#include "../../operator/metrics.h"
#include "../unit/test.h"

TEST(metrics_healthz_follows_the_loop)
{
    ASSERT(op_metrics_loop_healthy(0, 5000000));                      /* no turn yet */
    ASSERT(op_metrics_loop_healthy(1000, 1000 + OP_HEALTHZ_STALL_MS - 1));
    ASSERT(!op_metrics_loop_healthy(1000, 1000 + OP_HEALTHZ_STALL_MS)); /* stalled */
    ASSERT(!op_metrics_loop_healthy(1000, 1000 + 10 * OP_HEALTHZ_STALL_MS));
}

TEST(metrics_render_api_requests)
{
    op_metrics *m = op_metrics_new();
    ASSERT(m);
    op_metrics_api(m, 1234, 5);
    op_metrics_ready(m, 1);
    char *text = op_metrics_render(m);
    ASSERT(text);
    ASSERT(strstr(text, "# TYPE cirrus_operator_api_requests_total counter\n"));
    ASSERT(strstr(text, "\ncirrus_operator_api_requests_total 1234\n"));
    ASSERT(strstr(text, "\ncirrus_operator_api_throttled_total 5\n"));
    free(text);
    op_metrics_free(m);
}
