#include "core/copy.h"

#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvcr/error.h"
#include "util/event.h"

static void list_push(copy_job **head, copy_job **tail, copy_job *job)
{
    job->next = NULL;
    job->prev = *tail;
    if (*tail != NULL)
        (*tail)->next = job;
    else
        *head = job;
    *tail = job;
}

static void list_unlink(copy_job **head, copy_job **tail, copy_job *job)
{
    if (job->prev != NULL)
        job->prev->next = job->next;
    else
        *head = job->next;
    if (job->next != NULL)
        job->next->prev = job->prev;
    else
        *tail = job->prev;
    job->prev = job->next = NULL;
}

static void run_job(copy_job *job, bool fail)
{
    if (fail) {
        job->result = -1;
        return;
    }
    for (uint32_t i = 0; i < job->n_segs; i++)
        memcpy(job->segs[i].dst, job->segs[i].src, job->segs[i].len);
    job->result = 0;
}

static void *worker_main(void *arg)
{
    copy_engine *e = arg;
    pthread_mutex_lock(&e->lock);
    for (;;) {
        while (!e->stopping && (e->q_head == NULL || e->gate == COPY_GATE_HOLD_QUEUED))
            pthread_cond_wait(&e->wake, &e->lock);
        if (e->stopping) break;
        copy_job *job = e->q_head;
        list_unlink(&e->q_head, &e->q_tail, job);
        job->state = COPY_RUNNING;
        e->running++;
        while (e->gate == COPY_GATE_HOLD_RUNNING && !e->stopping)
            pthread_cond_wait(&e->gate_open, &e->lock);
        bool fail = e->fail_next > 0;
        if (fail) e->fail_next--;
        pthread_mutex_unlock(&e->lock);

        run_job(job, fail);

        pthread_mutex_lock(&e->lock);
        job->state = COPY_DONE;
        e->running--;
        bool was_empty = e->done_head == NULL;
        list_push(&e->done_head, &e->done_tail, job);
        if (was_empty) event_signal(e->event_fd);
        pthread_cond_broadcast(&e->idle);
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

int copy_engine_start(copy_engine *e, uint32_t n_threads, int event_fd)
{
    memset(e, 0, sizeof *e);
    e->event_fd = event_fd;
    e->threads = calloc(n_threads, sizeof *e->threads);
    if (e->threads == NULL) return KVCR_ENOMEM;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->gate_open, NULL);
    pthread_cond_init(&e->idle, NULL);
    for (uint32_t i = 0; i < n_threads; i++) {
        if (pthread_create(&e->threads[i], NULL, worker_main, e) != 0) {
            copy_engine_stop(e);
            copy_engine_destroy(e);
            return KVCR_ESYS;
        }
        e->n_threads++;
    }
    return 0;
}

void copy_engine_stop(copy_engine *e)
{
    pthread_mutex_lock(&e->lock);
    /* A held job must finish so that no copy outlives the engine. */
    e->gate = COPY_GATE_OPEN;
    pthread_cond_broadcast(&e->wake);
    pthread_cond_broadcast(&e->gate_open);
    while (e->running > 0) pthread_cond_wait(&e->idle, &e->lock);
    e->stopping = true;
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->lock);
    for (uint32_t i = 0; i < e->n_threads; i++) pthread_join(e->threads[i], NULL);
    free(e->threads);
    e->threads = NULL;
    e->n_threads = 0;
}

void copy_engine_destroy(copy_engine *e)
{
    pthread_cond_destroy(&e->idle);
    pthread_cond_destroy(&e->gate_open);
    pthread_cond_destroy(&e->wake);
    pthread_mutex_destroy(&e->lock);
}

void copy_submit(copy_engine *e, copy_job *job)
{
    pthread_mutex_lock(&e->lock);
    job->state = COPY_QUEUED;
    list_push(&e->q_head, &e->q_tail, job);
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
}

bool copy_cancel(copy_engine *e, copy_job *job)
{
    pthread_mutex_lock(&e->lock);
    bool queued = job->state == COPY_QUEUED;
    if (queued) {
        list_unlink(&e->q_head, &e->q_tail, job);
        job->state = COPY_IDLE;
    }
    pthread_mutex_unlock(&e->lock);
    return queued;
}

copy_job *copy_take_done(copy_engine *e)
{
    pthread_mutex_lock(&e->lock);
    copy_job *list = e->done_head;
    e->done_head = e->done_tail = NULL;
    pthread_mutex_unlock(&e->lock);
    return list;
}

void copy_set_gate(copy_engine *e, int gate)
{
    pthread_mutex_lock(&e->lock);
    e->gate = gate;
    pthread_cond_broadcast(&e->wake);
    pthread_cond_broadcast(&e->gate_open);
    pthread_mutex_unlock(&e->lock);
}

void copy_fail_next(copy_engine *e, uint32_t n)
{
    pthread_mutex_lock(&e->lock);
    e->fail_next = n;
    pthread_mutex_unlock(&e->lock);
}

bool copy_job_started(copy_engine *e, const copy_job *job)
{
    pthread_mutex_lock(&e->lock);
    bool started = job->state == COPY_RUNNING || job->state == COPY_DONE;
    pthread_mutex_unlock(&e->lock);
    return started;
}
