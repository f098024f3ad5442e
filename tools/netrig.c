#define _GNU_SOURCE /* setns, unshare, execvpe, pipe2, close_range */
#include "netrig.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "netrig_fwd.h"

extern char **environ;

/* How long the rig waits for one of its own steps (a keeper starting, an
 * `ip` run, a keeper's sweep) before calling it failed. */
#define NETRIG_STEP_MS 10000

struct netrig {
    netrig_opts o;
    unsigned n_ns;                       /* hosts, plus the switch when bridged */
    pid_t keeper[NETRIG_MAX_HOSTS + 1];  /* [n_hosts]: the switch */
    int pidfd[NETRIG_MAX_HOSTS + 1];     /* -1: not started or gone */
    pid_t fwd;                           /* delayed rigs: the forwarder, else 0 */
    int fwd_pidfd, fwd_ctl;
    char addr[NETRIG_MAX_HOSTS][24];
    char err[400];
};

static int fail(netrig *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(netrig *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    return -1;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Reads fd to its end or until ms pass, keeping the first cap-1 bytes as a
 * string: how many were kept, or -1 on the deadline. */
static ssize_t read_all(int fd, char *buf, size_t cap, int ms)
{
    size_t kept = 0;
    double end = now_ms() + ms;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(end - now_ms());
        if (left <= 0 || poll(&p, 1, left) == 0) return -1;
        char chunk[512];
        ssize_t k = read(fd, chunk, sizeof chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        size_t take = (size_t)k < cap - 1 - kept ? (size_t)k : cap - 1 - kept;
        memcpy(buf + kept, chunk, take);
        kept += take;
    }
    buf[kept] = 0;
    return (ssize_t)kept;
}

/* Waits up to ms for the process behind pidfd to exit, SIGKILLs it if it
 * has not, and reaps it. */
static void reap(pid_t pid, int pidfd, int ms)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0) pidfd_send_signal(pidfd, SIGKILL, NULL, 0);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) continue;
    close(pidfd);
}

/* Closes every descriptor from 3 up but the n of keep (a forked child of
 * the rig that stays: it holds none of the caller's pipes and sockets). */
static void close_except(const int *keep, size_t n)
{
    unsigned from = 3;
    for (;;) {
        unsigned next = ~0U;
        for (size_t i = 0; i < n; i++)
            if (keep[i] >= (int)from && (unsigned)keep[i] < next) next = (unsigned)keep[i];
        if (next > from) close_range(from, next == ~0U ? ~0U : next - 1, 0);
        if (next == ~0U) return;
        from = next + 1;
    }
}

/* ---- keepers ------------------------------------------------------------ */

/* SIGKILLs every process in this process's network namespace but itself,
 * until none is left (2 s at most): its namespaces then have no process
 * holding them. Zombies hold no namespace and show none. */
static void keeper_sweep(void)
{
    struct stat me;
    if (stat("/proc/self/ns/net", &me) != 0) return;
    pid_t self = getpid();
    for (int round = 0; round < 200; round++) {
        int found = 0;
        DIR *d = opendir("/proc");
        if (!d) return;
        for (struct dirent *e; (e = readdir(d));) {
            pid_t pid = (pid_t)atoi(e->d_name);
            char path[64];
            struct stat st;
            if (pid <= 0 || pid == self) continue;
            snprintf(path, sizeof path, "/proc/%d/ns/net", pid);
            if (stat(path, &st) != 0 || st.st_ino != me.st_ino || st.st_dev != me.st_dev) continue;
            kill(pid, SIGKILL);
            found++;
        }
        closedir(d);
        if (!found) return;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
}

/* Brings lo up in the current namespace: 0 or an errno. */
static int lo_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return errno;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    int err = ioctl(s, SIOCGIFFLAGS, &ifr) == 0 ? 0 : errno;
    ifr.ifr_flags |= IFF_UP;
    if (!err && ioctl(s, SIOCSIFFLAGS, &ifr) != 0) err = errno;
    close(s);
    return err;
}

/* The hosts speak IPv4 only: IPv6 would add router solicitations and DAD
 * frames to every link (and its own link-local routes). */
static void ipv6_off(void)
{
    const char *knobs[] = {"/proc/sys/net/ipv6/conf/all/disable_ipv6",
                           "/proc/sys/net/ipv6/conf/default/disable_ipv6"};
    for (size_t i = 0; i < 2; i++) {
        int fd = open(knobs[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0) continue;
        if (write(fd, "1", 1) != 1) { /* a kernel without IPv6 has nothing to turn off */
        }
        close(fd);
    }
}

/* The keeper (a forked child; blocked: the signals of set): unshares the
 * namespaces, names the host, reports 0 or an errno on ready, then waits for
 * a signal of set (its parent thread's death among them) and sweeps. */
static _Noreturn void keeper_main(const char *hostname, int ready, pid_t parent,
                                  const sigset_t *set)
{
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(0);
    int err = 0;
    if (unshare(CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0) err = errno;
    else if (sethostname(hostname, strlen(hostname)) != 0) err = errno;
    else err = lo_up();
    if (!err) ipv6_off();
    if (write(ready, &err, sizeof err) != (ssize_t)sizeof err || err) _exit(1);
    /* Holding none of the rig's descriptors (pipes, sockets, pidfds, its
     * output): a reader of the rig's output sees its end when the rig ends. */
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3 && null >= 0; fd++) dup2(null, fd);
    close_except(NULL, 0);
    int sig;
    while (sigwait(set, &sig) != 0) continue;
    keeper_sweep();
    _exit(0);
}

/* Starts the keeper of namespace set ns, named hostname. */
static int start_keeper(netrig *r, unsigned ns, const char *hostname)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return fail(r, "pipe: %s", strerror(errno));
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    /* Blocked before fork: the keeper never dies of these before sweeping. */
    pthread_sigmask(SIG_BLOCK, &set, &old);
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        close(p[0]);
        keeper_main(hostname, p[1], parent, &set);
    }
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return fail(r, "fork: %s", strerror(fork_errno));
    }
    r->keeper[ns] = pid;
    r->pidfd[ns] = pidfd_open(pid, 0);
    int err = -1;
    struct pollfd pl = {.fd = p[0], .events = POLLIN};
    if (poll(&pl, 1, NETRIG_STEP_MS) == 1 && read(p[0], &err, sizeof err) != (ssize_t)sizeof err)
        err = -1;
    close(p[0]);
    if (r->pidfd[ns] < 0) return fail(r, "pidfd_open: %s", strerror(errno));
    if (err)
        return fail(r, "making the namespaces of %s: %s", hostname,
                    err > 0 ? strerror(err) : "the keeper did not answer");
    return 0;
}

/* ---- commands inside a namespace ----------------------------------------- */

/* Runs argv (ip, tc, nft) in the network namespace of keeper ns, input
 * (NULL: nothing; a few KiB at most) on its standard input: 0, or -1
 * with the command and its output as the reason. */
static int ns_run(netrig *r, unsigned ns, const char *const argv[], const char *input)
{
    if (r->pidfd[ns] < 0) return fail(r, "%s: that host is gone", argv[0]);
    int p[2], in[2];
    if (pipe2(p, O_CLOEXEC) != 0) return fail(r, "pipe: %s", strerror(errno));
    /* A socket, not a pipe, for input: a command that ends before reading
     * it must not SIGPIPE the rig's process (MSG_NOSIGNAL). */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0) {
        close(p[0]);
        close(p[1]);
        return fail(r, "socketpair: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(p[1], 1);
        dup2(p[1], 2);
        if (setns(r->pidfd[ns], CLONE_NEWNET) == 0) execvp(argv[0], (char *const *)argv);
        dprintf(2, "%s", strerror(errno));
        _exit(127);
    }
    int fork_errno = errno;
    close(p[1]);
    close(in[0]);
    if (pid >= 0 && input &&
        send(in[1], input, strlen(input), MSG_NOSIGNAL) != (ssize_t)strlen(input))
        input = NULL; /* the command ended early: its output says why */
    close(in[1]);
    if (pid < 0) {
        close(p[0]);
        return fail(r, "fork: %s", strerror(fork_errno));
    }
    char out[200];
    ssize_t got = read_all(p[0], out, sizeof out, NETRIG_STEP_MS);
    close(p[0]);
    if (got < 0) kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) continue;
    if (got >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    char cmd[160] = "";
    for (size_t i = 0, at = 0; argv[i] && at < sizeof cmd; i++)
        at += (size_t)snprintf(cmd + at, sizeof cmd - at, "%s%s", i ? " " : "", argv[i]);
    out[strcspn(out, "\n")] = 0;
    return fail(r, "%s (`%s`)", got < 0 ? "no end in time" : out, cmd);
}

/* `nft` with one script in host's namespace: replaces table netdev name by
 * body (NULL: removes it). Adding then deleting first makes both
 * idempotent, in one transaction. */
static int nft_table(netrig *r, unsigned host, const char *name, const char *body)
{
    char script[640];
    snprintf(script, sizeof script, "add table netdev %s; delete table netdev %s%s%s%s%s", name,
             name, body ? "; table netdev " : "", body ? name : "", body ? " { " : "",
             body ? body : "");
    if (body) strncat(script, " }", sizeof script - strlen(script) - 1);
    const char *argv[] = {"nft", script, NULL};
    return ns_run(r, host, argv, NULL);
}

/* ---- making the rig -------------------------------------------------------- */

/* Bridged: the switch's br0, and per host a veth pair h<i> (a port) / eth0. */
static int wire_bridge(netrig *r)
{
    unsigned sw = r->o.n_hosts;
    if (start_keeper(r, sw, "kvcr-switch") != 0) return -1;
    /* One `ip` for all of it: each run costs a fork and an exec. */
    char script[160 * (NETRIG_MAX_HOSTS + 1)];
    size_t at = (size_t)snprintf(script, sizeof script,
                                 "link add name br0 type bridge\nlink set dev br0 up\n");
    for (unsigned h = 0; h < r->o.n_hosts; h++)
        at += (size_t)snprintf(script + at, sizeof script - at,
                               "link add name h%u type veth peer name eth0 netns %d\n"
                               "link set dev h%u master br0 up\n",
                               h, (int)r->keeper[h], h);
    const char *argv[] = {"ip", "-batch", "-", NULL};
    return ns_run(r, sw, argv, script);
}

/* Delayed: the forwarder, which makes each host's TAP eth0. */
static int wire_forwarder(netrig *r)
{
    int ready[2], ctl[2];
    if (pipe2(ready, O_CLOEXEC) != 0) return fail(r, "pipe: %s", strerror(errno));
    /* ctl is a socket: a send to a forwarder that died must not SIGPIPE the
     * rig's process (MSG_NOSIGNAL). */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) != 0) {
        close(ready[0]);
        close(ready[1]);
        return fail(r, "socketpair: %s", strerror(errno));
    }
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0);
        int keep[NETRIG_MAX_HOSTS + 2] = {ctl[0], ready[1]};
        memcpy(keep + 2, r->pidfd, r->o.n_hosts * sizeof *keep);
        close_except(keep, r->o.n_hosts + 2);
        netrig_fwd_run(r->o.n_hosts, r->pidfd, r->o.delay_us, ctl[0], ready[1]);
    }
    int fork_errno = errno;
    close(ready[1]);
    close(ctl[0]);
    r->fwd_ctl = ctl[1];
    if (pid < 0) {
        close(ready[0]);
        return fail(r, "fork: %s", strerror(fork_errno));
    }
    r->fwd = pid;
    r->fwd_pidfd = pidfd_open(pid, 0);
    netrig_fwd_ready rd = {-1, -1};
    struct pollfd pl = {.fd = ready[0], .events = POLLIN};
    if (poll(&pl, 1, NETRIG_STEP_MS) == 1 && read(ready[0], &rd, sizeof rd) != (ssize_t)sizeof rd)
        rd.err = -1;
    close(ready[0]);
    if (r->fwd_pidfd < 0) return fail(r, "pidfd_open: %s", strerror(errno));
    if (rd.err)
        return fail(r, "the forwarder making host %d's TAP: %s", rd.host,
                    rd.err > 0 ? strerror(rd.err) : "no answer");
    return 0;
}

/* Host h's address on eth0, its link up, its rate and loss. */
static int configure_host(netrig *r, unsigned h)
{
    char script[96];
    snprintf(script, sizeof script, "addr add %s/15 dev eth0\nlink set dev eth0 up\n",
             r->addr[h]);
    const char *ip[] = {"ip", "-batch", "-", NULL};
    if (ns_run(r, h, ip, script) != 0) return -1;
    if (r->o.rate_bps) {
        /* TBF needs a bucket of at least one frame; 4 ms at the rate (at
         * least four full frames) keeps bursts short at any rate. */
        char rate[32], burst[32];
        uint64_t b = r->o.rate_bps / 8 / 250;
        snprintf(rate, sizeof rate, "%llubit", (unsigned long long)r->o.rate_bps);
        snprintf(burst, sizeof burst, "%llu", (unsigned long long)(b > 6056 ? b : 6056));
        const char *tbf[] = {"tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
                             rate, "burst", burst, "latency", "100ms", NULL};
        if (ns_run(r, h, tbf, NULL) != 0) return -1;
    }
    return r->o.loss > 0 ? netrig_set_loss(r, h, r->o.loss) : 0;
}

bool netrig_available(char *why, size_t why_len)
{
    if (geteuid() != 0) {
        snprintf(why, why_len, "the netns rig needs root (euid %d)", (int)geteuid());
        return false;
    }
    const char *tools[] = {"ip", "tc", "nft"};
    for (size_t i = 0; i < 3; i++) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tools[i]);
        if (system(cmd) != 0) {
            snprintf(why, why_len, "the netns rig needs `%s` (Debian: iproute2, nftables)",
                     tools[i]);
            return false;
        }
    }
    /* Hosts are joined and signalled through pidfds (no pid reuse race):
     * Linux 5.8, and a valgrind that knows the calls. */
    int self = pidfd_open(getpid(), 0);
    if (self < 0) {
        snprintf(why, why_len, "the netns rig needs pidfd_open (Linux 5.3+): %s", strerror(errno));
        return false;
    }
    close(self);
    pid_t pid = fork();
    if (pid == 0) _exit(unshare(CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) == 0 ? 0 : errno);
    int st = 0;
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR) continue;
    if (pid < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(why, why_len, "the netns rig cannot make namespaces: %s",
                 pid < 0 ? strerror(errno) : strerror(WEXITSTATUS(st)));
        return false;
    }
    return true;
}

int netrig_up(const netrig_opts *opts, netrig **out, char *why, size_t why_len)
{
    *out = NULL;
    if (opts->n_hosts < 1 || opts->n_hosts > NETRIG_MAX_HOSTS || !(opts->loss >= 0) ||
        opts->loss > 1) {
        snprintf(why, why_len, "netrig_up: n_hosts must be 1..%d and loss in [0, 1]",
                 NETRIG_MAX_HOSTS);
        return -1;
    }
    netrig *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, why_len, "netrig_up: out of memory");
        return -1;
    }
    r->o = *opts;
    r->n_ns = opts->n_hosts + (opts->delay_us ? 0 : 1);
    r->fwd_pidfd = r->fwd_ctl = -1;
    for (unsigned i = 0; i <= NETRIG_MAX_HOSTS; i++) r->pidfd[i] = -1;
    int rc = 0;
    for (unsigned h = 0; h < opts->n_hosts && rc == 0; h++) {
        char name[24];
        snprintf(r->addr[h], sizeof r->addr[h], "198.18.0.%u", h + 1);
        snprintf(name, sizeof name, "kvcr-h%u", h);
        rc = start_keeper(r, h, name);
    }
    if (rc == 0) rc = opts->delay_us ? wire_forwarder(r) : wire_bridge(r);
    for (unsigned h = 0; h < opts->n_hosts && rc == 0; h++) rc = configure_host(r, h);
    if (rc != 0) {
        snprintf(why, why_len, "%s", r->err);
        netrig_down(r);
        return -1;
    }
    *out = r;
    return 0;
}

/* ---- using it ----------------------------------------------------------------- */

static int check_host(netrig *r, unsigned host, const char *what)
{
    if (host >= r->o.n_hosts) return fail(r, "%s: no host %u", what, host);
    if (r->pidfd[host] < 0) return fail(r, "%s: host %u was killed", what, host);
    return 0;
}

const char *netrig_addr(const netrig *r, unsigned host)
{
    return host < r->o.n_hosts ? r->addr[host] : NULL;
}

pid_t netrig_spawn(netrig *r, unsigned host, char *const argv[], char *const envp[])
{
    if (check_host(r, host, "netrig_spawn") != 0) return -1;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return fail(r, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid == 0) {
        int err = 0;
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL); /* the program starts as from a shell */
        if (setns(r->pidfd[host], CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0) err = errno;
        else execvpe(argv[0], argv, envp ? envp : environ);
        if (!err) err = errno;
        if (write(p[1], &err, sizeof err) != (ssize_t)sizeof err) _exit(127);
        _exit(127);
    }
    int fork_errno = errno;
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return fail(r, "netrig_spawn: fork: %s", strerror(fork_errno));
    }
    /* The pipe ends at exec (close-on-exec) or carries the child's errno. */
    int err = 0;
    ssize_t k;
    while ((k = read(p[0], &err, sizeof err)) < 0 && errno == EINTR) continue;
    close(p[0]);
    if (k <= 0) return pid;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) continue;
    return fail(r, "netrig_spawn %s on host %u: %s", argv[0], host, strerror(err));
}

int netrig_join(netrig *r, unsigned host)
{
    if (check_host(r, host, "netrig_join") != 0) return -1;
    if (setns(r->pidfd[host], CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0)
        return fail(r, "netrig_join host %u: %s", host, strerror(errno));
    return 0;
}

int netrig_link(netrig *r, unsigned host, bool up)
{
    if (check_host(r, host, "netrig_link") != 0) return -1;
    if (r->o.delay_us) {
        uint8_t m[2] = {(uint8_t)host, up};
        if (send(r->fwd_ctl, m, sizeof m, MSG_NOSIGNAL) != (ssize_t)sizeof m)
            return fail(r, "netrig_link: the forwarder: %s", strerror(errno));
        return 0;
    }
    char port[16];
    snprintf(port, sizeof port, "h%u", host);
    const char *argv[] = {"ip", "link", "set", "dev", port, up ? "up" : "down", NULL};
    return ns_run(r, r->o.n_hosts, argv, NULL);
}

int netrig_partition(netrig *r, unsigned host, bool on)
{
    if (check_host(r, host, "netrig_partition") != 0) return -1;
    return nft_table(r, host, "netrig_part",
                     on ? "chain in { type filter hook ingress device \"eth0\" priority 0; "
                          "policy drop; }; chain out { type filter hook egress device \"eth0\" "
                          "priority 0; policy drop; };"
                        : NULL);
}

int netrig_set_loss(netrig *r, unsigned host, double fraction)
{
    if (check_host(r, host, "netrig_set_loss") != 0) return -1;
    if (!(fraction >= 0) || fraction > 1)
        return fail(r, "netrig_set_loss: the fraction must be in [0, 1]");
    long per_million = (long)(fraction * 1e6 + 0.5);
    char when[64] = ""; /* numgen's values stop at 999999: all is no condition */
    if (per_million < 1000000)
        snprintf(when, sizeof when, "numgen random mod 1000000 < %ld ", per_million);
    char body[200];
    snprintf(body, sizeof body,
             "chain out { type filter hook egress device \"eth0\" priority 0; %sdrop; };", when);
    return nft_table(r, host, "netrig_loss", fraction > 0 ? body : NULL);
}

/* Signals keeper ns to sweep and exit, or (wait) reaps it. */
static void end_keeper(netrig *r, unsigned ns, bool wait)
{
    if (r->pidfd[ns] < 0) return;
    if (!wait) {
        pidfd_send_signal(r->pidfd[ns], SIGTERM, NULL, 0);
        return;
    }
    reap(r->keeper[ns], r->pidfd[ns], NETRIG_STEP_MS);
    r->pidfd[ns] = -1;
}

int netrig_kill_host(netrig *r, unsigned host)
{
    if (check_host(r, host, "netrig_kill_host") != 0) return -1;
    end_keeper(r, host, false);
    end_keeper(r, host, true);
    return 0;
}

void netrig_down(netrig *r)
{
    if (!r) return;
    /* All keepers sweep at once, then each is reaped. */
    for (unsigned ns = 0; ns < r->n_ns; ns++) end_keeper(r, ns, false);
    for (unsigned ns = 0; ns < r->n_ns; ns++) end_keeper(r, ns, true);
    if (r->fwd_ctl >= 0) close(r->fwd_ctl);
    if (r->fwd > 0 && r->fwd_pidfd >= 0) reap(r->fwd, r->fwd_pidfd, NETRIG_STEP_MS);
    else if (r->fwd > 0) waitpid(r->fwd, NULL, 0);
    free(r);
}

const char *netrig_last_error(const netrig *r)
{
    return r->err;
}
