// A JIT runtime as another user writes one, for tests/tests/security.rs: copies a spinning
// function into anonymous executable memory at a fixed address, runs it for the given seconds,
// and writes its perf map (/tmp/perf-PID.map) naming it `jit_spin`, followed by the given
// number of MiB of the smallest lines a map can have.
//   jit SECONDS FILLER_MIB
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

// dec %rdi; jnz -5; ret: spins %rdi times.
static const unsigned char SPIN[] = {0x48, 0xff, 0xcf, 0x75, 0xfb, 0xc3};
#define JIT_ADDRESS ((void *)0x3f0000000000UL)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    double seconds = atof(argv[1]);
    long filler = atol(argv[2]) << 20;
    unsigned char *code = mmap(JIT_ADDRESS, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (code == MAP_FAILED) return 3;
    memcpy(code, SPIN, sizeof SPIN);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    FILE *map = fopen(path, "w");
    if (!map) return 4;
    fprintf(map, "%lx %zx jit_spin\n", (unsigned long)code, sizeof SPIN);
    for (long written = 0; written < filler; written += 6) fputs("0 1 a\n", map);
    fclose(map);
    void (*spin)(unsigned long) = (void (*)(unsigned long))code;
    for (double start = now(); now() - start < seconds;) spin(1000000);
    return 0;
}
