/* kvcr/error.h — error codes and the last-error message.
 *
 * Every public function returns 0 on success or a negative KVCR_E* code.
 * On failure it also records a message on the calling thread that names the
 * rule that was broken; kvcr_last_error() returns it until the next failing
 * call on the same thread. A failing call changes no state. */
#ifndef KVCR_ERROR_H
#define KVCR_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

enum {
    KVCR_OK = 0,
    KVCR_EINVAL = -1,      /* an argument or configuration value is invalid */
    KVCR_ENOMEM = -2,      /* out of memory; nothing was changed */
    KVCR_ECLOSED = -3,     /* the instance was closed */
    KVCR_ENOTSUP = -4,     /* the feature is not built or not supported */
    KVCR_EBUSY = -5,       /* called re-entrantly from inside a callback */
    KVCR_ENOENT = -6,      /* the named object does not exist */
    KVCR_ESYS = -7,        /* a system call failed (the message has errno) */
    KVCR_EPROTO = -8,      /* a peer or the service sent bytes that break the protocol */
    KVCR_EREFUSED = -9,    /* the KVCR service refused the request (the message says why) */
    KVCR_ELIMIT = -10,     /* a configured limit (kvcr_limits) is reached; the message names it */
    KVCR_EUNAVAIL = -11    /* the KVCR service is not reachable (guard mode; the message says why) */
};

/* A short, static description of an error code ("invalid argument"). */
const char *kvcr_strerror(int err);

/* The message of the last failing call on this thread, or "" if none. */
const char *kvcr_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
