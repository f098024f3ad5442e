/* The tool and test plumbing without the daemon (see tool_util.h). */
#include "tool_util.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void tool_cmd_list(FILE *f, const tool_cmd *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char head[64];
        snprintf(head, sizeof head, "%s %s", t[i].name, t[i].args);
        fprintf(f, "  %-34s %s\n", head, t[i].help);
    }
}

const tool_cmd *tool_cmd_find(const tool_cmd *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(name, t[i].name) == 0) return &t[i];
    return NULL;
}

double tool_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tool_read_full(int fd, void *buf, size_t len, double deadline)
{
    char *p = buf;
    while (len > 0) {
        double left = deadline - tool_now();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, left > 1 ? 1000 : (int)(left * 1000) + 1);
        if (r < 0 && errno != EINTR) return -1;
        if (r <= 0) continue;
        ssize_t n = read(fd, p, len);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) {
            if (n == 0) errno = EPIPE;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int tool_write_full(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

void tool_remote_peer(kvcr_config *cfg)
{
    cfg->remote.enabled = true;
    cfg->remote.control_host = "127.0.0.1";
    cfg->callbacks.key_hash = tool_key_hash;
}

int tool_key_hash(void *ud, const kvcr_key *key, uint64_t *hash)
{
    (void)ud;
    if (key->len < 2 || key->len > 21 || key->data[0] != 'k') return -1;
    uint64_t x = 0;
    for (size_t i = 1; i < key->len; i++) {
        if (key->data[i] < '0' || key->data[i] > '9') return -1;
        x = x * 10 + (uint64_t)(key->data[i] - '0');
    }
    *hash = x;
    return 0;
}

double tool_metric(const char *text, const char *name)
{
    double v = -1;
    size_t len = strlen(name);
    for (const char *line = text; line && *line;) {
        if (strncmp(line, name, len) == 0 && line[len] == ' ') v = atof(line + len + 1);
        const char *nl = strchr(line, '\n');
        line = nl ? nl + 1 : NULL;
    }
    return v;
}
