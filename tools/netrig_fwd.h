/* The delayed rig's forwarder (netrig.h: delay_us > 0): one process that
 * makes every host's TAP "eth0" and switches Ethernet frames between them,
 * holding each delay_us before passing it on.
 *
 * Contract: netrig.c forks a child that calls netrig_fwd_run, which never
 * returns. It joins each host's network namespace through the keeper's
 * pidfd only to make the TAP there, then writes to ready one netrig_fwd_ready
 * (err 0, or the errno and the host that failed, after which it exits).
 * It reads 2-byte messages {host, up} from ctl (netrig_link) and exits at
 * ctl's end of file, reporting its drops on stderr. It closes a host's TAP
 * when that host's keeper exits, so the host's namespace can go.
 *
 * Threads: the forwarder is one single-threaded process; nothing is shared. */
#ifndef KVCR_TOOLS_NETRIG_FWD_H
#define KVCR_TOOLS_NETRIG_FWD_H

#include <stdint.h>

typedef struct netrig_fwd_ready {
    int err;
    int host;
} netrig_fwd_ready;

_Noreturn void netrig_fwd_run(unsigned n_hosts, const int *keeper_pidfd, uint32_t delay_us,
                              int ctl, int ready);

#endif
