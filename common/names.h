/* names: the one check for the names the trainer's messages carry (a coordinator member's
 * name and host, a region's name between gateways): a length range and a character set,
 * ASCII letters and digits plus the punctuation each kind of name allows. Checked with
 * explicit ranges, not isalnum(): the locale must not widen what a peer may send. */
#ifndef CIRRUS_NAMES_H
#define CIRRUS_NAMES_H

#include <stddef.h>

/* 1 if s (NULL: the empty string) is min..max bytes of [A-Za-z0-9] and the bytes of punct. */
int name_chars_ok(const char *s, size_t min, size_t max, const char *punct);

#endif
