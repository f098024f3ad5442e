/* Marks the functions that make up the public ABI (everything else in the
 * shared library is hidden). */
#ifndef KVCR_UTIL_API_H
#define KVCR_UTIL_API_H
#define KVCR_API __attribute__((visibility("default")))

/* An internal function that libkvcr exports under the internal prefix:
 * `int kvcr_fail(...) KVCR_INTERNAL(fail);` keeps the name kvcr_fail in the
 * sources and makes the symbol kvcr__fail (the symbol rule: every global
 * symbol of libkvcr is kvcr_ public or kvcr__ internal). */
#define KVCR_INTERNAL(name) __asm__("kvcr__" #name) KVCR_API
#endif
