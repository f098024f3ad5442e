/* See pipes.h. Runs on any thread or process; no shared state. */
#include "pipes.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
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

void pipe_child_fork(pipe_child *ch, pipe_child_fn fn, void *arg)
{
    int cmd[2], resp[2];
    if (pipe(cmd) != 0 || pipe(resp) != 0) abort();
    fflush(NULL); /* buffered output is not written twice */
    ch->pid = fork();
    if (ch->pid < 0) abort();
    if (ch->pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1) _exit(6);
        close(cmd[1]);
        close(resp[0]);
        _exit(fn(cmd[0], resp[1], arg));
    }
    close(cmd[0]);
    close(resp[1]);
    ch->cmd = cmd[1];
    ch->resp = resp[0];
}

int pipe_child_reap(pipe_child *ch, bool kill_it)
{
    if (ch->pid <= 0) return -1;
    if (kill_it) kill(ch->pid, SIGKILL);
    int ws = 0;
    while (waitpid(ch->pid, &ws, 0) < 0 && errno == EINTR) {
    }
    ch->pid = 0;
    close(ch->cmd);
    close(ch->resp);
    return ws;
}
