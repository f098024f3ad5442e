#define _GNU_SOURCE /* F_DUPFD_CLOEXEC */
#include "net/tcpreset.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvcr/error.h"
#include "util/log.h"

/* Whether a socket's peer address a is p: same family, address and port. */
static bool same_peer(const struct sockaddr_storage *a, const struct sockaddr_storage *p)
{
    if (a->ss_family != p->ss_family) return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)p;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)p;
        return x->sin6_port == y->sin6_port &&
               memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
    }
    return false;
}

/* Whether fd is a connected TCP socket whose peer is one of peers[0..n). */
static bool connected_to(int fd, const struct sockaddr_storage *peers, size_t n)
{
    int proto = 0;
    socklen_t len = sizeof proto;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) != 0 || proto != IPPROTO_TCP)
        return false; /* not a socket, or not TCP */
    struct sockaddr_storage peer;
    len = sizeof peer;
    if (getpeername(fd, (struct sockaddr *)&peer, &len) != 0) return false; /* not connected */
    for (size_t i = 0; i < n; i++)
        if (same_peer(&peer, &peers[i])) return true;
    return false;
}

int tcp_reset_peers(const struct sockaddr_storage *peers, size_t n)
{
    if (peers == NULL && n > 0) return kvcr_fail(KVCR_EINVAL, "tcp_reset_peers: no addresses");
    if (n == 0) return 0;
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL)
        return kvcr_fail(KVCR_ESYS, "cannot list this process's descriptors (/proc/self/fd): %s",
                         strerror(errno));
    int reset = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd < 0 || fd == dirfd(dir)) continue;
        /* The duplicate names the socket even if fd is closed and reused
         * by another thread before we are done with it. */
        int dup = fcntl((int)fd, F_DUPFD_CLOEXEC, 0);
        if (dup < 0) continue; /* closed since the listing */
        if (connected_to(dup, peers, n)) {
            struct sockaddr unspec = {.sa_family = AF_UNSPEC};
            if (connect(dup, &unspec, sizeof unspec) == 0) reset++;
        }
        close(dup);
    }
    closedir(dir);
    return reset;
}
