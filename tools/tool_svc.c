/* The service's metrics for the benches and tests that watch a service
 * (see tool_util.h): apart from tool_util.c because it needs the daemon's
 * svc_fetch_metrics, which a program links only when it uses these. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/service.h"
#include "tool_util.h"

double tool_svc_metric(const char *sock, const char *name)
{
    char *text = NULL;
    if (svc_fetch_metrics(sock, &text) != 0) return -1;
    double v = tool_metric(text, name);
    free(text);
    return v;
}

double tool_wait_serving(const char *sock, uint32_t guard, double promotions, double limit_s)
{
    char phase[128], promoted[128];
    snprintf(phase, sizeof phase, "kvcr_guard_phase{guard=\"%u\",phase=\"serving\"}", guard);
    snprintf(promoted, sizeof promoted, "kvcr_guard_promotions_total{guard=\"%u\"}", guard);
    double until = tool_now() + limit_s;
    do {
        if (tool_svc_metric(sock, phase) == 1) {
            double n = tool_svc_metric(sock, promoted);
            if (promotions < 0 || n == promotions) return n;
        }
        nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
    } while (tool_now() < until);
    return -1;
}
