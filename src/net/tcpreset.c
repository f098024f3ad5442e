#define _GNU_SOURCE /* F_DUPFD_CLOEXEC */
#include "net/tcpreset.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "kvcr/error.h"
#include "util/log.h"

/* Whether a and b are the same host: same family and address. */
static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
    }
    return false;
}

static in_port_t port_of(const struct sockaddr_storage *a)
{
    return a->ss_family == AF_INET ? ((const struct sockaddr_in *)a)->sin_port
                                   : ((const struct sockaddr_in6 *)a)->sin6_port;
}

/* Whether a and b are the same socket address: host and port. */
static bool same_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    return same_host(a, b) && port_of(a) == port_of(b);
}

static bool one_of(const struct sockaddr_storage *a, const struct sockaddr_storage *set, size_t n,
                   bool (*same)(const struct sockaddr_storage *, const struct sockaddr_storage *))
{
    for (size_t i = 0; i < n; i++)
        if (same(a, &set[i])) return true;
    return false;
}

/* Whether fd's connection still holds bytes: sent and not acknowledged,
 * or received and not read. */
static bool holds_bytes(int fd)
{
    int out = 0, in = 0;
    return (ioctl(fd, SIOCOUTQ, &out) == 0 && out > 0) || (ioctl(fd, SIOCINQ, &in) == 0 && in > 0);
}

/* Whether fd is a connected TCP socket with the peer (tcpreset.h). */
static bool with_peer(int fd, const tcp_ends *e)
{
    int proto = 0;
    socklen_t len = sizeof proto;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) != 0 || proto != IPPROTO_TCP)
        return false; /* not a socket, or not TCP */
    struct sockaddr_storage peer, local;
    len = sizeof peer;
    if (getpeername(fd, (struct sockaddr *)&peer, &len) != 0) return false; /* not connected */
    if (one_of(&peer, e->peer, e->n_peer, same_address)) return true; /* we opened it */
    len = sizeof local;
    return getsockname(fd, (struct sockaddr *)&local, &len) == 0 &&
           one_of(&local, e->ours, e->n_ours, same_address) &&
           one_of(&peer, e->peer, e->n_peer, same_host) && holds_bytes(fd);
}

int tcp_reset_peer(const tcp_ends *e)
{
    if (e == NULL || (e->peer == NULL && e->n_peer > 0) || (e->ours == NULL && e->n_ours > 0))
        return kvcr_fail(KVCR_EINVAL, "tcp_reset_peer: no addresses");
    if (e->n_peer == 0) return 0;
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL)
        return kvcr_fail(KVCR_ESYS, "cannot list this process's descriptors (/proc/self/fd): %s",
                         strerror(errno));
    int reset = 0;
    for (struct dirent *d; (d = readdir(dir)) != NULL;) {
        char *end;
        long fd = strtol(d->d_name, &end, 10);
        if (end == d->d_name || *end != '\0' || fd < 0 || fd == dirfd(dir)) continue;
        /* The duplicate names the socket even if fd is closed and reused
         * by another thread before we are done with it. */
        int dup = fcntl((int)fd, F_DUPFD_CLOEXEC, 0);
        if (dup < 0) continue; /* closed since the listing */
        if (with_peer(dup, e)) {
            struct sockaddr unspec = {.sa_family = AF_UNSPEC};
            if (connect(dup, &unspec, sizeof unspec) == 0) reset++;
        }
        close(dup);
    }
    closedir(dir);
    return reset;
}
