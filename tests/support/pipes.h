/* Helper processes a test forks, and whole writes and reads on the two
 * pipes between it and each of them (the UCX tests' verifiers, victims,
 * survivors and connectors). */
#ifndef KVCR_TEST_PIPES_H
#define KVCR_TEST_PIPES_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Writes all n bytes, retrying on EINTR; a pipe that fails ends the
 * calling process with status 90 (a helper whose parent is gone stops). */
void pipe_put_all(int fd, const void *p, size_t n);
/* Reads exactly n bytes, retrying on EINTR; false on end of file or error. */
bool pipe_get_all(int fd, void *p, size_t n);

/* A forked helper and the test's ends of its pipes. */
typedef struct pipe_child {
    pid_t pid;     /* 0 once reaped (or never forked) */
    int cmd, resp; /* the test writes commands to cmd, reads answers from resp */
} pipe_child;

/* A helper's body: its ends of the pipes and the caller's argument; what
 * it returns is its exit status. */
typedef int (*pipe_child_fn)(int cmd, int resp, void *arg);

/* Forks fn(arg) with a command pipe and an answer pipe. The helper never
 * outlives the test, even one that crashed (it would run forever): it is
 * killed when the test dies, and exits 6 at once if the test is already
 * gone. Aborts if the pipes or the fork cannot be made. */
void pipe_child_fork(pipe_child *ch, pipe_child_fn fn, void *arg);

/* Reaps ch, killing it first if asked, and closes the test's ends of its
 * pipes: its wait status, or -1 if there is no helper. */
int pipe_child_reap(pipe_child *ch, bool kill_it);

#endif
