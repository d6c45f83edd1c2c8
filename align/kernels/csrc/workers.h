/* Runs fn over jobs[0..threads) (an array of `size`-byte job structs): job 0 on the calling thread, the others on
   pthreads started for this call. A job whose thread cannot be started runs on the calling thread afterwards, so
   every job always runs; returns 0, or -1 when some thread could not be started. The kernels split their work into
   jobs of whole independent items, so the result does not depend on the thread count. */
#ifndef ALIGN_WORKERS_H
#define ALIGN_WORKERS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define ALIGN_MAX_WORKERS 64

static inline int64_t align_workers(int64_t threads, int64_t items) {
    if (threads > items) threads = items;
    if (threads > ALIGN_MAX_WORKERS) threads = ALIGN_MAX_WORKERS;
    return threads < 1 ? 1 : threads;
}

static inline int align_run_workers(void *(*fn)(void *), void *jobs, size_t size, int64_t threads) {
    pthread_t tids[ALIGN_MAX_WORKERS];
    int started[ALIGN_MAX_WORKERS] = {0}, rc = 0;
    char *base = (char *)jobs;
    for (int64_t w = 1; w < threads; w++) {
        started[w] = pthread_create(&tids[w], NULL, fn, base + w * size) == 0;
        if (!started[w]) rc = -1;
    }
    fn(base);
    for (int64_t w = 1; w < threads; w++) {
        if (started[w]) pthread_join(tids[w], NULL);
        else fn(base + w * size);
    }
    return rc;
}

#endif
