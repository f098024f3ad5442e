/* See pipes.h. Runs on any thread or process; no shared state. */
#include "pipes.h"

#include <errno.h>
#include <unistd.h>

void pipe_put_all(int fd, const void *p, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, (const char *)p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) _exit(90);
        done += (size_t)w;
    }
}

bool pipe_get_all(int fd, void *p, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t r = read(fd, (char *)p + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        done += (size_t)r;
    }
    return true;
}
