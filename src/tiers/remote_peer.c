/* Peers of the remote tier: what we know of a control endpoint (whether it
 * acknowledged our metadata, its incarnation as last learned, eager
 * publishing asked by a hint). Locked; a file of its own so that the pull
 * state machine (remote_target.c) links without the progress thread. */
#include <stdlib.h>
#include <string.h>

#include "tiers/remote_int.h"

rpeer *peer_get(remote *r, const char *endpoint, bool create)
{
    for (uint32_t i = 0; i < r->n_peers; i++)
        if (strcmp(r->peers[i].endpoint, endpoint) == 0) return &r->peers[i];
    if (!create || strlen(endpoint) > CTL_MAX_ENDPOINT) return NULL;
    if (r->n_peers == r->cap_peers) {
        uint32_t cap = r->cap_peers ? 2 * r->cap_peers : 16;
        rpeer *p = realloc(r->peers, cap * sizeof *p);
        if (p == NULL) return NULL;
        r->peers = p;
        r->cap_peers = cap;
    }
    rpeer *p = &r->peers[r->n_peers++];
    memset(p, 0, sizeof *p);
    strcpy(p->endpoint, endpoint);
    return p;
}

void peer_invalidate(remote *r, const char *endpoint)
{
    rpeer *p = peer_get(r, endpoint, false);
    if (p != NULL) p->acked = false, p->retry_ns = 0;
}
