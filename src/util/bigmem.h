/* Large zeroed allocations backed by transparent huge pages where the
 * kernel allows (madvise mode): the block index's random accesses then
 * miss the TLB far less often. */
#ifndef KVCR_UTIL_BIGMEM_H
#define KVCR_UTIL_BIGMEM_H

#include <stddef.h>

void *kvcr_big_alloc(size_t size); /* zeroed, or NULL */
void kvcr_big_free(void *p, size_t size);

#endif
