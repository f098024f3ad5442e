/* Marks the functions that make up the public ABI (everything else in the
 * shared library is hidden). */
#ifndef KVCR_UTIL_API_H
#define KVCR_UTIL_API_H
#define KVCR_API __attribute__((visibility("default")))
#endif
