/* Touching a new thread's memory before it serves anyone.
 *
 * A page a thread touches for the first time costs a page fault: about a
 * microsecond on bare metal, 10-12 us on the virtual machines CI runs on
 * (docs/BENCHMARKS.md, "First contact"). A progress thread's first message
 * touches new stack pages (decoders keep bit sets there) and new pages of
 * the malloc arena glibc makes for the thread, a dozen faults on each side
 * of a pull: a first contact paid them where a later pull does not.
 * thread_prefault() takes them at start instead. */
#ifndef KVCR_UTIL_PREFAULT_H
#define KVCR_UTIL_PREFAULT_H

/* Call first thing in a thread: touches PREFAULT_STACK bytes of its stack
 * below the caller's frame and PREFAULT_HEAP bytes of its malloc arena,
 * which glibc keeps after the free (under its trim threshold, 128 KiB). A
 * failed malloc only leaves the arena cold. */
void thread_prefault(void);

#endif
