/* A workload the stack-unwinding tests build with `gcc -O2 -fomit-frame-pointer`, so that
 * only unwind tables (.eh_frame) describe its frames: the main thread sorts records through
 * glibc's qsort with a comparison callback (record_key <- compare_records <- qsort internals
 * <- sort_records <- main), a second thread copies blocks with memcpy (copy_blocks <-
 * copier_main <- start_thread). Runs for argv[1] milliseconds of wall time. With argv[2]
 * "deep", main instead calls descend 24 levels deep, each level holding 1 KiB of stack, and
 * spins in record_key at the bottom: a stack of about 25 KiB, 30 user frames from _start to
 * record_key (argv[3], at least 7, sets that number; the bench measures unwinding at 10 and
 * 30). With argv[2] "clock", main only
 * reads the clock, in the vDSO. With argv[2] "mix", two threads each recurse through frameless
 * functions (recurse <- work), sort through glibc's qsort (leaf_mix <- compare_ints <- qsort
 * internals <- sort_some <- work) and copy with memcpy (copy_some <- work), under a profiling
 * timer whose signal handler does work too (so samples land above a signal frame). With argv[2]
 * "dlopen", main sorts for the first half of the time, then loads the library argv[3]
 * (tests/workloads/c/dlopened.c) with dlopen and runs its library_work for the rest. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
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

__attribute__((noinline)) static unsigned long leaf_mix(unsigned long x)
{
    for (int i = 0; i < 200; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

__attribute__((noinline)) static unsigned long recurse(int depth, unsigned long x)
{
    if (depth == 0)
        return leaf_mix(x);
    unsigned long local[4] = {x, x + 1, x + 2, (unsigned long)depth};
    return recurse(depth - 1, local[depth & 3] ^ x) + local[(depth + 1) & 3];
}

__attribute__((noinline)) static int compare_ints(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    sink += leaf_mix((unsigned long)x) & 1;
    return (x > y) - (x < y);
}

__attribute__((noinline)) static void sort_some(unsigned seed)
{
    int values[256];
    for (int i = 0; i < 256; i++)
        values[i] = (int)((seed = seed * 1103515245u + 12345u) >> 8);
    qsort(values, 256, sizeof values[0], compare_ints);
    sink += values[0];
}

__attribute__((noinline)) static void copy_some(char *to, const char *from, size_t len)
{
    for (int i = 0; i < 64; i++)
        memcpy(to + (i & 7), from, len - 8);
    sink += to[len / 2];
}

__attribute__((noinline)) static void work(void)
{
    static char from[1 << 16], to[(1 << 16) + 8];
    for (unsigned round = 0; now() < deadline; round++) {
        sink += recurse(24, round);
        sort_some(round);
        copy_some(to, from, sizeof from);
    }
}

static void on_alarm(int signal)
{
    (void)signal;
    for (int i = 0; i < 256; i++)
        sink += recurse(6, sink);
}

static void *thread_main(void *unused)
{
    (void)unused;
    work();
    return NULL;
}

__attribute__((noinline)) static void mix(void)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_alarm;
    sigaction(SIGPROF, &action, NULL);
    struct itimerval every = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_PROF, &every, NULL);
    pthread_t thread;
    pthread_create(&thread, NULL, thread_main, NULL);
    work();
    pthread_join(thread, NULL);
}

int main(int argc, char **argv)
{
    deadline = now() + (argc > 1 ? atoi(argv[1]) : 1000) / 1000.0;
    if (argc > 2 && strcmp(argv[2], "deep") == 0) {
        /* _start, __libc_start_main, __libc_start_call_main, main, descend(n)..descend(0),
         * record_key: n + 6 frames. */
        int frames = argc > 3 ? atoi(argv[3]) : 30;
        sink = descend(frames > 6 ? frames - 6 : 0);
        return 0;
    }
    if (argc > 3 && strcmp(argv[2], "dlopen") == 0) {
        double end = deadline;
        deadline = (now() + end) / 2;
        static unsigned long records[RECORDS];
        while (now() < deadline) {
            for (size_t i = 0; i < RECORDS; i++)
                records[i] = record_key(&records[(i + 1) % RECORDS]) + i;
            sort_records(records, RECORDS);
        }
        void *library = dlopen(argv[3], RTLD_NOW);
        unsigned long (*work)(double, double (*)(void)) =
            library ? (unsigned long (*)(double, double (*)(void)))dlsym(library, "library_work")
                    : NULL;
        if (!work) {
            fprintf(stderr, "no_frame_pointers: %s\n", dlerror());
            return 1;
        }
        sink = work(end, now);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "mix") == 0) {
        mix();
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
