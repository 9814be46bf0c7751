/* role_args: see role_args.h. */
#include "role_args.h"

#include "cerr.h"

int role_stage_layers(int n_layer, int n_stages, int stage, int *l0, int *l1)
{
    if (n_stages < 1 || n_layer < n_stages || stage < 0 || stage >= n_stages)
        return CIRRUS_EINVAL;
    /* 64-bit products: the same quotients as local's int arithmetic, without its overflow. */
    *l0 = (int)((long long)stage * n_layer / n_stages);
    *l1 = (int)((long long)(stage + 1) * n_layer / n_stages);
    return 0;
}
