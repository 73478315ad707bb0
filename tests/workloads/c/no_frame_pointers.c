/* A workload the stack-unwinding tests build with `gcc -O2 -fomit-frame-pointer`, so that
 * only unwind tables (.eh_frame) describe its frames: the main thread sorts records through
 * glibc's qsort with a comparison callback (record_key <- compare_records <- qsort internals
 * <- sort_records <- main), a second thread copies blocks with memcpy (copy_blocks <-
 * copier_main <- start_thread). Runs for argv[1] milliseconds of wall time. With argv[2]
 * "deep", main instead calls descend 24 levels deep, each level holding 1 KiB of stack, and
 * spins in record_key at the bottom: a stack of about 25 KiB. With argv[2] "clock", main only
 * reads the clock, in the vDSO. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RECORDS 4096
#define BLOCK (256 * 1024)

static volatile unsigned long sink;
static double deadline;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline, noipa)) unsigned long record_key(const unsigned long *record)
{
    unsigned long key = *record;
    for (int round = 0; round < 24; round++)
        key = (key ^ (key >> 29)) * 0xbf58476d1ce4e5b9ul;
    return key;
}

__attribute__((noinline, noipa)) int compare_records(const void *a, const void *b)
{
    unsigned long ka = record_key(a), kb = record_key(b);
    return (ka > kb) - (ka < kb);
}

__attribute__((noinline, noipa)) void sort_records(unsigned long *records, size_t n)
{
    qsort(records, n, sizeof *records, compare_records);
    sink += records[0];
}

__attribute__((noinline, noipa)) void copy_blocks(char *to, const char *from)
{
    for (int i = 0; i < 16; i++) {
        memcpy(to, from, BLOCK);
        sink += (unsigned char)to[i];
    }
}

__attribute__((noinline, noipa)) void *copier_main(void *unused)
{
    (void)unused;
    char *from = malloc(BLOCK), *to = malloc(BLOCK);
    memset(from, 7, BLOCK);
    while (now() < deadline)
        copy_blocks(to, from);
    free(from);
    free(to);
    return NULL;
}

__attribute__((noinline, noipa)) unsigned long descend(int depth)
{
    volatile char frame[1024];
    frame[depth] = (char)depth;
    if (depth == 0) {
        unsigned long key = 1;
        while (now() < deadline)
            for (int i = 0; i < 10000; i++)
                key = record_key(&key);
        return key;
    }
    return descend(depth - 1) + frame[depth];
}

int main(int argc, char **argv)
{
    deadline = now() + (argc > 1 ? atoi(argv[1]) : 1000) / 1000.0;
    if (argc > 2 && strcmp(argv[2], "deep") == 0) {
        sink = descend(24);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "clock") == 0) {
        while (now() < deadline)
            ;
        return 0;
    }
    pthread_t copier;
    pthread_create(&copier, NULL, copier_main, NULL);
    static unsigned long records[RECORDS];
    unsigned long seed = 88172645463325252ul;
    while (now() < deadline) {
        for (size_t i = 0; i < RECORDS; i++) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            records[i] = seed;
        }
        sort_records(records, RECORDS);
    }
    pthread_join(copier, NULL);
    return 0;
}
