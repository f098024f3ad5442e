/* Whole writes and reads on the pipes between a test and the helper
 * processes it forks (the UCX tests' verifiers, victims and connectors). */
#ifndef KVCR_TEST_PIPES_H
#define KVCR_TEST_PIPES_H

#include <stdbool.h>
#include <stddef.h>

/* Writes all n bytes, retrying on EINTR; a pipe that fails ends the
 * calling process with status 90 (a helper whose parent is gone stops). */
void pipe_put_all(int fd, const void *p, size_t n);
/* Reads exactly n bytes, retrying on EINTR; false on end of file or error. */
bool pipe_get_all(int fd, void *p, size_t n);

#endif
