/* names: see names.h. */
#include "names.h"

#include <string.h>

int name_chars_ok(const char *s, size_t min, size_t max, const char *punct)
{
    const size_t n = s ? strlen(s) : 0;
    if (n < min || n > max) return 0;
    for (size_t i = 0; i < n; i++) {
        const char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr(punct, c)))
            return 0;
    }
    return 1;
}
