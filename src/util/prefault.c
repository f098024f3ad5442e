#include "util/prefault.h"

#include <stdlib.h>
#include <string.h>

#define PREFAULT_STACK (64 * 1024)
#define PREFAULT_HEAP (96 * 1024)
#define PAGE 4096

static void __attribute__((noinline)) touch_stack(void)
{
    volatile char pad[PREFAULT_STACK];
    for (size_t i = 0; i < sizeof pad; i += PAGE) pad[i] = 0;
}

void thread_prefault(void)
{
    touch_stack();
    char *p = malloc(PREFAULT_HEAP);
    if (p == NULL) return;
    memset(p, 0, PREFAULT_HEAP);
    /* The compiler may not drop the writes with the free that follows. */
    __asm__ volatile("" : : "r"(p) : "memory");
    free(p);
}
