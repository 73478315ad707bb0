/* A workload for naming stripped binaries from separate debug files (debuginfod): built with
 * -g, its debug information split off and the binary stripped of every symbol, so that only
 * the debug file names `hot_path`, `cold_path`, the function `scramble` inlined into both, and
 * their lines. Time splits about 3:1 between the two paths; runs for argv[1] seconds. */
#include <stdlib.h>
#include <time.h>

static inline __attribute__((always_inline)) unsigned long scramble(unsigned long x)
{
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

__attribute__((noinline)) unsigned long hot_path(unsigned long x)
{
    for (int i = 0; i < 3000; i++)
        x = scramble(x) + i;
    return x;
}

__attribute__((noinline)) unsigned long cold_path(unsigned long x)
{
    for (int i = 0; i < 1000; i++)
        x = scramble(x) - i;
    return x;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 2;
    double end = now() + seconds;
    volatile unsigned long sink = 1;
    while (now() < end)
        for (int round = 0; round < 100; round++)
            sink = hot_path(sink) + cold_path(sink);
    return 0;
}
