/* The netns rig: N "hosts" on this machine, for the tests, the benches and
 * the demo that need KVCR to run across machines (issue 16).
 *
 * What it makes. Host i (0 <= i < n_hosts) is a set of Linux namespaces —
 * network, IPC and UTS — with its own hostname "kvcr-h<i>", its loopback up
 * and one interface "eth0" holding the address netrig_addr(r, i) =
 * "198.18.0.<i+1>", prefix /15 (the benchmarking range 198.18.0.0/15). UCX
 * and the kernel see another machine: no shared System V IPC, another
 * hostname, another network stack. The hosts' links meet:
 *   - delay_us == 0: on a Linux bridge "br0" in a switch namespace of its
 *     own ("kvcr-switch"), each host's eth0 being one end of a veth pair
 *     whose other end ("h<i>") is a bridge port. Bandwidth figures are taken
 *     on these links.
 *   - delay_us > 0 (this kernel has no netem): eth0 is a TAP device and a
 *     forwarder process switches Ethernet frames between the hosts' TAPs
 *     (learning MAC addresses, flooding broadcasts and unknown ones), holding
 *     each frame delay_us before passing it on, in order. A frame from one
 *     host to another crosses the forwarder once, so a round trip takes
 *     2 × delay_us plus the stacks' time. At most 2048 frames wait; a frame
 *     over that bound, or that a TAP refuses, is dropped and counted (the
 *     forwarder reports the count on stderr when the rig goes down).
 * Rate (rate_bps > 0): a TBF qdisc on each host's eth0 (what it sends).
 * Loss: an nftables rule on each host's eth0 egress drops that fraction of
 * the frames the host sends (so a frame between two hosts is lost with
 * exactly that probability).
 * Nothing can leave the machine: the addresses exist only inside the rig's
 * namespaces, no namespace has a default route or NAT, and no interface of
 * the calling process's namespace is created, moved or attached.
 *
 * How cleanup is guaranteed. Each namespace is held by a "keeper" process
 * (a child of the thread that called netrig_up) that unshared it. No named
 * `ip netns` entry exists: the namespaces live only as long as processes are
 * in them. A keeper gets SIGTERM from the kernel when that thread dies for
 * any reason (PR_SET_PDEATHSIG; SIGKILL of the rig's process included), and
 * on SIGTERM, SIGINT, SIGHUP or SIGQUIT it SIGKILLs every process in its
 * network namespace (whoever started it) and exits. With the last process
 * gone the kernel removes the namespace and its interfaces: the veth pairs
 * (both ends) and the bridge; the forwarder (PR_SET_PDEATHSIG SIGKILL)
 * closes a host's TAP when its keeper exits, which removes the TAP. So:
 * call netrig_up from a thread that outlives the rig (the main thread).
 *
 * Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), /dev/net/tun for delayed rigs,
 * and `ip`, `tc` and `nft` (Debian iproute2, nftables) on the PATH.
 * netrig_available says why not when it cannot run; dependent tests skip
 * with that reason.
 *
 * Processes. netrig_spawn starts a program inside a host (fork, join the
 * host's namespaces with setns, exec): it is the caller's child, reaped by
 * the caller with waitpid as usual, including after netrig_kill_host or
 * netrig_down killed it. The rig reaps its own keepers, forwarder and
 * `ip`/`tc`/`nft` runs by their pids: callers must not reap with
 * waitpid(-1, ...) nor ignore SIGCHLD while a rig is up.
 *
 * Threads: a rig is used from one thread at a time. Errors: functions
 * returning int give 0, or -1 with the reason in netrig_last_error(r). */
#ifndef KVCR_TOOLS_NETRIG_H
#define KVCR_TOOLS_NETRIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define NETRIG_MAX_HOSTS 32

typedef struct netrig netrig;

typedef struct netrig_opts {
    unsigned n_hosts;  /* 1 .. NETRIG_MAX_HOSTS */
    uint32_t delay_us; /* each way; 0: veth links on a bridge, no forwarder */
    uint64_t rate_bps; /* each host's sending rate in bit/s; 0: unlimited */
    double loss;       /* fraction in [0, 1] of the frames each host sends dropped */
} netrig_opts;

/* Whether this process can make a rig; if not, false and the reason in why
 * (e.g. "needs root (euid 1000)"). */
bool netrig_available(char *why, size_t why_len);

/* Makes the hosts of *opts: 0 and *out, or -1 with the reason in why and
 * nothing left behind. Takes tens of milliseconds a host. */
int netrig_up(const netrig_opts *opts, netrig **out, char *why, size_t why_len);

/* Host's IPv4 address, "198.18.0.<host+1>" (NULL for a host out of range). */
const char *netrig_addr(const netrig *r, unsigned host);

/* Starts argv (searched on the PATH; envp NULL: this process's environment)
 * inside host's namespaces, with this process's other open descriptors
 * (those without FD_CLOEXEC) and no signal blocked. Its pid, or -1 (the reason in
 * netrig_last_error: a bad host, a killed host, exec failing). */
pid_t netrig_spawn(netrig *r, unsigned host, char *const argv[], char *const envp[]);

/* Moves the calling thread into host's namespaces (setns), for a forked
 * child that runs code there without exec (after fork, before anything
 * else). Not for the rig's own process: its later calls need its own
 * namespace. 0 or -1. */
int netrig_join(netrig *r, unsigned host);

/* Takes host's link down (false) or back up (true). Down, nothing passes
 * on it either way and the host's eth0 reports no carrier (bridged) or its
 * frames are dropped by the forwarder (delayed); addresses and routes stay. */
int netrig_link(netrig *r, unsigned host, bool up);

/* Partitions host (on) or ends it (off): every frame to or from it is
 * dropped at its eth0 (an nftables netdev rule), its link stays up. */
int netrig_partition(netrig *r, unsigned host, bool on);

/* Drops fraction (0 .. 1) of the frames host sends; 0 removes the rule. */
int netrig_set_loss(netrig *r, unsigned host, double fraction);

/* Destroys host: every process in its namespaces is SIGKILLed (the ones it
 * spawned there are left for the caller to reap), its namespaces and link
 * vanish. Its other calls then fail. Returns when the keeper has gone. */
int netrig_kill_host(netrig *r, unsigned host);

/* Kills every host and the forwarder, reaps the rig's own processes and
 * frees r (NULL: nothing). Returns when they are gone. */
void netrig_down(netrig *r);

/* The reason of r's last failed call ("" if none). */
const char *netrig_last_error(const netrig *r);

#endif
