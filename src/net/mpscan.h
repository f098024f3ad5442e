/* The pre-scan every msgpack decoder of outside bytes runs first (control
 * messages, claim-socket frames): it walks the encoding without building
 * anything and refuses what could make msgpack-c allocate more than the
 * bytes justify or recurse too deep, so the unpacker only ever sees a
 * bounded, well-formed object. */
#ifndef KVCR_NET_MPSCAN_H
#define KVCR_NET_MPSCAN_H

#include <stddef.h>
#include <stdint.h>

#define MPSCAN_MAX_DEPTH 16

/* NULL when p holds exactly one msgpack object, with no ext types, at
 * most max_objects objects in all, containers nested at most max_depth
 * (<= MPSCAN_MAX_DEPTH) deep, and no container promising more elements
 * than bytes remain; otherwise a short static reason. */
const char *mpscan(const uint8_t *p, size_t len, size_t max_objects, int max_depth);

#endif
