/* A workload for unwinding without frame pointers, built with -O2 -fomit-frame-pointer:
 * recursion through frameless functions, glibc's qsort calling back into the program, memcpy,
 * a second thread, and a signal handler that does work (so samples land above a signal frame).
 * Usage: no_frame_pointers SECONDS */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile unsigned long sink;
static volatile int stop;

__attribute__((noinline)) static unsigned long leaf_mix(unsigned long x) {
    for (int i = 0; i < 200; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

__attribute__((noinline)) static unsigned long descend(int depth, unsigned long x) {
    if (depth == 0)
        return leaf_mix(x);
    unsigned long local[4] = {x, x + 1, x + 2, (unsigned long)depth};
    return descend(depth - 1, local[depth & 3] ^ x) + local[(depth + 1) & 3];
}

__attribute__((noinline)) static int compare_ints(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    sink += leaf_mix((unsigned long)x) & 1;
    return (x > y) - (x < y);
}

__attribute__((noinline)) static void sort_some(unsigned seed) {
    int values[256];
    for (int i = 0; i < 256; i++)
        values[i] = (int)((seed = seed * 1103515245u + 12345u) >> 8);
    qsort(values, 256, sizeof values[0], compare_ints);
    sink += values[0];
}

__attribute__((noinline)) static void copy_some(char *to, const char *from, size_t len) {
    for (int i = 0; i < 64; i++)
        memcpy(to + (i & 7), from, len - 8);
    sink += to[len / 2];
}

static double elapsed(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

__attribute__((noinline)) static void work(double seconds) {
    static char from[1 << 16], to[(1 << 16) + 8];
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned round = 0; !stop && elapsed(&start) < seconds; round++) {
        sink += descend(24, round);
        sort_some(round);
        copy_some(to, from, sizeof from);
    }
}

static void on_alarm(int signal) {
    (void)signal;
    for (int i = 0; i < 256; i++)
        sink += descend(6, sink);
}

static void *thread_main(void *seconds) {
    work(*(double *)seconds);
    return NULL;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_alarm;
    sigaction(SIGPROF, &action, NULL);
    struct itimerval every = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_PROF, &every, NULL);
    pthread_t thread;
    pthread_create(&thread, NULL, thread_main, &seconds);
    work(seconds);
    pthread_join(thread, NULL);
    return 0;
}
