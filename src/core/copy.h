/* Copy workers: same-process copies (framework DRAM <-> KVCR DRAM) run as
 * memcpy on a few threads, so deposit and deliver return at once.
 *
 * A job is queued, then RUNNING on one worker, then DONE on the completion
 * list that the instance drains in kvcr_poll(). A QUEUED job can be
 * cancelled; a RUNNING one cannot, and the instance must wait for its
 * completion before it reuses the memory. The engine never frees jobs: the
 * submitter owns them. */
#ifndef KVCR_CORE_COPY_H
#define KVCR_CORE_COPY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum copy_state { COPY_IDLE = 0, COPY_QUEUED, COPY_RUNNING, COPY_DONE };

typedef struct copy_seg {
    void *dst;
    const void *src;
    size_t len;
} copy_seg;

typedef struct copy_job {
    struct copy_job *prev, *next; /* queue or completion list */
    int state;                    /* enum copy_state; under the engine lock */
    int result;                   /* 0, or -1 when the copy failed */
    void *owner;                  /* what the submitter needs back */
    uint32_t owner_idx;
    uint8_t kind;                 /* the submitter's tag for owner */
    uint64_t submit_ns;
    uint32_t n_segs;
    copy_seg *segs;
} copy_job;

/* Test gates (see include/kvcr/testing.h). */
enum copy_gate {
    COPY_GATE_OPEN = 0,
    COPY_GATE_HOLD_QUEUED,  /* workers take no job */
    COPY_GATE_HOLD_RUNNING  /* workers take a job, then wait before copying */
};

typedef struct copy_engine {
    pthread_mutex_t lock;
    pthread_cond_t wake;   /* jobs queued, gate opened or stopping */
    /* The test gate opened: where a worker holding a RUNNING job waits.
     * Apart from wake because copy_submit signals one waiter on wake: had
     * the held worker been that one, the idle worker slept on and the new
     * job stayed queued (test-deadline-abort-close saw 1 of 2 running). */
    pthread_cond_t gate_open;
    pthread_cond_t idle;   /* a job left RUNNING */
    copy_job *q_head, *q_tail;
    copy_job *done_head, *done_tail;
    pthread_t *threads;
    uint32_t n_threads;
    uint32_t running;
    int gate;
    uint32_t fail_next; /* test hook: fail this many coming jobs */
    bool stopping;
    int event_fd;       /* written when the completion list becomes non-empty */
} copy_engine;

int copy_engine_start(copy_engine *e, uint32_t n_threads, int event_fd);
/* Cancels nothing: waits for running jobs, then joins the threads. Queued
 * jobs stay queued (the caller cancels them first). The completion list
 * stays readable until copy_engine_destroy(). */
void copy_engine_stop(copy_engine *e);
void copy_engine_destroy(copy_engine *e);

void copy_submit(copy_engine *e, copy_job *job);
/* True if the job was still queued and is now out of the engine. */
bool copy_cancel(copy_engine *e, copy_job *job);
/* Moves the completion list to the caller, oldest first. */
copy_job *copy_take_done(copy_engine *e);

void copy_set_gate(copy_engine *e, int gate);
void copy_fail_next(copy_engine *e, uint32_t n);
/* True once a thread has taken the job (it is RUNNING or DONE). */
bool copy_job_started(copy_engine *e, const copy_job *job);

#endif
