/* Framework memory: a block reference (label, index) resolved into the
 * pieces it is made of, and the pairing of two piece lists into copy or
 * write runs (core/conf.h). Pure functions over tables the caller owns:
 * no lock, any thread. */
#include <string.h>

#include "core/conf.h"

size_t pieces_pool_len(const char *label)
{
    const char *colon = strrchr(label, ':');
    return colon ? (size_t)(colon - label) : strlen(label);
}

/* Whether region label `rl` is "<pool>:<part>" for the pool name's first
 * pool_len bytes. */
static bool is_part_of(const char *rl, const char *pool, size_t pool_len)
{
    return strncmp(rl, pool, pool_len) == 0 && rl[pool_len] == ':' && rl[pool_len + 1] != '\0' &&
           pieces_pool_len(rl) == pool_len;
}

static bool element_of(const region_geom *r, uint64_t index, uint32_t i, mem_piece *out)
{
    if (index >= r->count) return false;
    *out = (mem_piece){r->addr + index * r->stride, r->element_size, i};
    return true;
}

uint32_t pieces_resolve(const region_geom *g, size_t n, bool framework, const char *label,
                        uint64_t index, mem_piece *out, const char **why)
{
    size_t len = strlen(label);
    bool all = framework && len >= 2 && strcmp(label + len - 2, PART_ALL) == 0;
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (g[i].framework != framework) continue;
        if (all ? !is_part_of(g[i].label, label, len - 2) : strcmp(g[i].label, label) != 0)
            continue;
        if (k == PIECES_MAX) {
            *why = "a block has more parts than a reference may name";
            return 0;
        }
        if (!element_of(&g[i], index, (uint32_t)i, &out[k++])) {
            out[0] = (mem_piece){0, 0, (uint32_t)i}; /* the region it is out of */
            *why = "index out of range";
            return 0;
        }
        if (!all) return 1;
    }
    if (k == 0) *why = all ? "no region is a part of that pool" : "no region has that label";
    return k;
}

uint32_t pieces_pair(const mem_piece *a, uint32_t na, const mem_piece *b, uint32_t nb,
                     piece_pair *out)
{
    uint32_t i = 0, j = 0, n = 0;
    uint64_t ao = 0, bo = 0; /* bytes of a[i] and b[j] already paired */
    while (i < na && j < nb) {
        uint64_t ra = a[i].len - ao, rb = b[j].len - bo;
        uint64_t len = ra < rb ? ra : rb;
        out[n++] = (piece_pair){a[i].addr + ao, b[j].addr + bo, len, a[i].region, b[j].region};
        ao += len;
        bo += len;
        if (ao == a[i].len) i++, ao = 0;
        if (bo == b[j].len) j++, bo = 0;
    }
    return n;
}
