#include "net/ucxaddr.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <string.h>

#define ADDR_V1 0
#define HDR_DEBUG_INFO 0x1
#define HDR_CLIENT_ID 0x4
#define MD_EMPTY_DEV 0x80
#define DEV_LAST 0x80
#define DEV_NUM_PATHS 0x40
#define DEV_SYS_DEVICE 0x20
#define DEV_LEN_MASK 0x1f
#define TL_LAST 0x80
#define TL_HAS_EP_ADDR 0x40
#define TL_LEN_MASK 0x3f
#define NULL_RESOURCE 0xff /* in place of the first device: there is none */
#define TL_ATTR_LEN 16 /* overhead, bandwidth, latency (floats), prio and flags */

typedef struct cursor {
    const uint8_t *p;
    size_t pos, len;
} cursor;

static bool take(cursor *cu, size_t n, const uint8_t **out)
{
    if (n > cu->len - cu->pos) return false;
    if (out != NULL) *out = cu->p + cu->pos;
    cu->pos += n;
    return true;
}

static bool take_u8(cursor *cu, uint8_t *v)
{
    const uint8_t *b;
    if (!take(cu, 1, &b)) return false;
    *v = *b;
    return true;
}

static float float_at(const uint8_t *b)
{
    float f;
    memcpy(&f, b, sizeof f);
    return f;
}

/* The three costs UCX turns into a lane score: a NaN, a negative time or
 * a zero bandwidth makes it assert. */
static bool attrs_sane(const uint8_t *attr)
{
    float overhead = float_at(attr), bandwidth = float_at(attr + 4), latency = float_at(attr + 8);
    /* A negative bandwidth is how UCX <= 1.11 sent "dedicated - shared". */
    return isfinite(overhead) && overhead >= 0 && overhead < 1 && isfinite(latency) &&
           latency >= 0 && latency < 1 && isfinite(bandwidth) && fabsf(bandwidth) >= 1 &&
           fabsf(bandwidth) < 1e15f;
}

static const ucxaddr_tl *shape_find(const ucxaddr_shape *s, uint16_t csum)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->tl[i].csum == csum) return &s->tl[i];
    return NULL;
}

static int bad(ucxaddr_walk *w, const char *what)
{
    w->why = what;
    return -1;
}

/* A TCP interface entry, in the layout UCX 1.13 emits: the device address
 * is a flags byte, the socket family and the IP address (the loopback
 * device, flag 1, carries a host identifier instead: its address is the
 * loopback one); the interface address is the listening port in network
 * order. An entry of another shape is left out: an abort cannot reset the
 * connections to it (net/ucx.c, reset_tcp). */
#define TCP_DEV_LOOPBACK 0x1

static void tcp_collect(ucxaddr_walk *w, const uint8_t *iface, uint8_t iface_len)
{
    ucxaddr_tcp *t = w->tcp;
    const uint8_t *d = w->dev;
    if (t->n == UCXADDR_TCP_MAX || iface_len != sizeof(in_port_t) || w->dev_len < 2) return;
    bool loopback = d[0] & TCP_DEV_LOOPBACK;
    struct sockaddr_storage *ss = &t->at[t->n];
    memset(ss, 0, sizeof *ss);
    if (d[1] == AF_INET && (loopback || w->dev_len == 2 + sizeof(struct in_addr))) {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        in->sin_family = AF_INET;
        memcpy(&in->sin_port, iface, sizeof in->sin_port);
        if (loopback) in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        else memcpy(&in->sin_addr, d + 2, sizeof in->sin_addr);
    } else if (d[1] == AF_INET6 && (loopback || w->dev_len == 2 + sizeof(struct in6_addr))) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
        in6->sin6_family = AF_INET6;
        memcpy(&in6->sin6_port, iface, sizeof in6->sin6_port);
        if (loopback) in6->sin6_addr = in6addr_loopback;
        else memcpy(&in6->sin6_addr, d + 2, sizeof in6->sin6_addr);
    } else {
        return;
    }
    t->n++;
}

static int tl_entry(cursor *cu, ucxaddr_walk *w, bool *last)
{
    const uint8_t *b, *attr, *iface;
    uint8_t flags;
    if (++w->n_tls > UCXADDR_MAX_TLS) return bad(w, "too many transports");
    if (!take(cu, 2, &b) || !take(cu, TL_ATTR_LEN, &attr) || !take_u8(cu, &flags))
        return bad(w, "truncated transport entry");
    uint16_t csum;
    memcpy(&csum, b, sizeof csum);
    if (!attrs_sane(attr)) return bad(w, "transport attributes out of range");
    /* A worker address carries no endpoint addresses. */
    if (flags & TL_HAS_EP_ADDR) return bad(w, "endpoint address in a worker address");
    uint8_t iface_len = flags & TL_LEN_MASK;
    if (!take(cu, iface_len, &iface)) return bad(w, "truncated interface address");
    const ucxaddr_tl *mine = w->check ? shape_find(w->check, csum) : NULL;
    if (mine != NULL && mine->iface_len != iface_len)
        return bad(w, "interface address length differs from this host's");
    if (w->learn != NULL && shape_find(w->learn, csum) == NULL)
        w->learn->tl[w->learn->n++] = (ucxaddr_tl){csum, iface_len};
    if (w->tcp != NULL && csum == w->tcp_csum) tcp_collect(w, iface, iface_len);
    *last = flags & TL_LAST;
    return 0;
}

static int device(cursor *cu, ucxaddr_walk *w, bool *last)
{
    uint8_t md, dev, v;
    if (!take_u8(cu, &md) || !take_u8(cu, &dev)) return bad(w, "truncated device");
    if ((dev & DEV_NUM_PATHS) && (!take_u8(cu, &v) || v < 2))
        return bad(w, "bad device path count");
    if ((dev & DEV_SYS_DEVICE) && !take_u8(cu, &v)) return bad(w, "truncated device");
    w->dev_len = dev & DEV_LEN_MASK;
    if (!take(cu, w->dev_len, &w->dev)) return bad(w, "truncated device address");
    *last = dev & DEV_LAST;
    bool last_tl = md & MD_EMPTY_DEV;
    while (!last_tl)
        if (tl_entry(cu, w, &last_tl) != 0) return -1;
    return 0;
}

int ucxaddr_walk_address(const uint8_t *a, size_t len, ucxaddr_walk *w)
{
    cursor cu = {a, 0, len};
    uint8_t hdr, v;
    w->n_tls = 0;
    w->why = NULL;
    w->dev = NULL;
    w->dev_len = 0;
    if (w->learn != NULL) w->learn->n = 0;
    if (w->tcp != NULL) w->tcp->n = 0;
    if (a == NULL) return bad(w, "no address");
    if (!take_u8(&cu, &hdr)) return bad(w, "empty");
    if ((hdr & 0x0f) != ADDR_V1) return bad(w, "not a v1 address");
    /* v1 always carries the worker id, whatever the flags say. */
    if (!take(&cu, 8, NULL)) return bad(w, "truncated header");
    if (((hdr >> 4) & HDR_CLIENT_ID) && !take(&cu, 8, NULL)) return bad(w, "truncated header");
    if (((hdr >> 4) & HDR_DEBUG_INFO) && (!take_u8(&cu, &v) || !take(&cu, v, NULL)))
        return bad(w, "truncated worker name");
    /* Well formed, but nothing UCX could connect to: refused here. */
    if (cu.pos < len && a[cu.pos] == NULL_RESOURCE) return bad(w, "no transports");
    bool last = false;
    while (!last)
        if (device(&cu, w, &last) != 0) return -1;
    if (w->n_tls == 0) return bad(w, "no transports");
    if (cu.pos != len) return bad(w, "trailing bytes");
    return 0;
}
