#include "util/bigmem.h"

#include <sys/mman.h>

#define HUGE_PAGE (2u << 20)

void *kvcr_big_alloc(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* Only a hint: without THP the memory is simply made of small pages. */
    if (size >= HUGE_PAGE) (void)madvise(p, size, MADV_HUGEPAGE);
    return p;
}

void kvcr_big_free(void *p, size_t size)
{
    if (p != NULL) munmap(p, size);
}
