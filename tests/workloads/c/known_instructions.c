/* A workload with a known number of user-mode instructions, for the emulated Arm PMU suite
 * (`cargo xtask arm-pmu`): each loop iteration is exactly two instructions (`subs`, `b.ne`), so
 * `one_share(n)` retires 2n and `three_shares(3n)` 6n, plus a few for their entries and
 * returns. aarch64 only; built static (and with -fno-ipa-icf, so the two identical functions
 * stay two), so the guest needs no libraries. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static void one_share(unsigned long n)
{
    __asm__ volatile("1: subs %0, %0, #1\n\tb.ne 1b" : "+r"(n) : : "cc");
}

__attribute__((noinline)) static void three_shares(unsigned long n)
{
    __asm__ volatile("1: subs %0, %0, #1\n\tb.ne 1b" : "+r"(n) : : "cc");
}

int main(int argc, char **argv)
{
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 0) : 0;
    if (n == 0) {
        fprintf(stderr, "usage: known_instructions ITERATIONS\n");
        return 2;
    }
    one_share(n);
    three_shares(3 * n);
    printf("known_instructions: %lu loop instructions, one_share %lu, three_shares %lu\n",
           8 * n, 2 * n, 6 * n);
    return 0;
}
