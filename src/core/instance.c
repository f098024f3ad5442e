/* The instance lock, and the log lines written while it is held.
 *
 * A log callback never runs under the instance lock: a line logged by a
 * thread that holds it (a policy hook's caller, the progress thread
 * settling transfers) is queued, and delivered by that same thread right
 * after it releases the lock. A line logged without the lock (a copy
 * thread, the G3 I/O thread, kvcr_create) goes straight to the sink. So a
 * sink that takes a lock of its own (Python's GIL) can never wait on a
 * thread that waits on the instance. */
#include "core/instance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The instance whose lock this thread holds: a policy hook that calls back
 * into it gets KVCR_EBUSY instead of a deadlock, and its log lines wait. */
static _Thread_local const kvcr_t *held_by_this_thread;

/* Lines kept while the lock is held; past this many they are counted and
 * reported as one line instead (a flood cannot grow memory). */
#define LOG_QUEUE_MAX 1024

struct log_line {
    struct log_line *next;
    kvcr_log_level level;
    char text[];
};

void instance_lock(kvcr_t *kv)
{
    pthread_mutex_lock(&kv->lock);
    held_by_this_thread = kv;
}

bool instance_held_here(const kvcr_t *kv)
{
    return held_by_this_thread == kv;
}

static void deliver_lines(kvcr_t *kv, struct log_line *lines, uint64_t dropped)
{
    while (lines != NULL) {
        struct log_line *next = lines->next;
        kv->conf.cb.log(kv->conf.cb.ud, lines->level, lines->text);
        free(lines);
        lines = next;
    }
    if (dropped > 0) {
        char text[KVCR_NAME_MAX + 128];
        snprintf(text, sizeof text,
                 "kvcr[%s]: %llu log line(s) dropped: more than %d written under the "
                 "instance lock at once", kv->conf.agent_name, (unsigned long long)dropped,
                 LOG_QUEUE_MAX);
        kv->conf.cb.log(kv->conf.cb.ud, KVCR_LOG_WARN, text);
    }
}

void instance_unlock(kvcr_t *kv)
{
    struct log_line *lines = kv->log_head;
    uint64_t dropped = kv->log_dropped;
    kv->log_head = kv->log_tail = NULL;
    kv->n_log = 0;
    kv->log_dropped = 0;
    held_by_this_thread = NULL;
    pthread_mutex_unlock(&kv->lock);
    if (lines != NULL || dropped > 0) deliver_lines(kv, lines, dropped);
}

/* The instance logger's sink when the caller gave a log callback. */
static void queue_or_deliver(void *ud, kvcr_log_level level, const char *message)
{
    kvcr_t *kv = ud;
    if (held_by_this_thread != kv) {
        kv->conf.cb.log(kv->conf.cb.ud, level, message);
        return;
    }
    size_t len = strlen(message) + 1;
    struct log_line *l = kv->n_log < LOG_QUEUE_MAX ? malloc(sizeof *l + len) : NULL;
    if (l == NULL) {
        kv->log_dropped++;
        return;
    }
    l->next = NULL;
    l->level = level;
    memcpy(l->text, message, len);
    if (kv->log_tail)
        kv->log_tail->next = l;
    else
        kv->log_head = l;
    kv->log_tail = l;
    kv->n_log++;
}

void instance_logger_init(kvcr_t *kv)
{
    if (kv->conf.cb.log)
        kvcr_logger_init(&kv->log, kv->conf.agent_name, queue_or_deliver, kv);
    else
        kvcr_logger_init(&kv->log, kv->conf.agent_name, NULL, NULL);
}
