// Another user's program for tests/tests/security.rs: spins in a function of its own shared
// library (built from this file with -DVICTIM_LIBRARY), tells the test it is done with the
// library by creating a file, then spins in a function of the program itself, and ends without
// running the library's code again (_exit), so that its owner may truncate the library meanwhile.
//   victim LIBRARY_SECONDS TOTAL_SECONDS DONE_FILE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef VICTIM_LIBRARY
__attribute__((noinline)) unsigned long victim_library_spin(unsigned long n) {
    volatile unsigned long sum = 0;
    for (unsigned long i = 0; i < n; i++) sum += i * i;
    return sum;
}
#else
unsigned long victim_library_spin(unsigned long n);

__attribute__((noinline)) unsigned long victim_program_spin(unsigned long n) {
    volatile unsigned long sum = 0;
    for (unsigned long i = 0; i < n; i++) sum += i ^ (i >> 3);
    return sum;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    double in_library = atof(argv[1]), total = atof(argv[2]), start = now();
    unsigned long sum = 0;
    while (now() - start < in_library) sum += victim_library_spin(100000);
    FILE *done = fopen(argv[3], "w");
    if (done) fclose(done);
    while (now() - start < total) sum += victim_program_spin(100000);
    printf("%lu\n", sum);
    fflush(stdout);
    _exit(0);
}
#endif
