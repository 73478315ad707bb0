/* The library tests/workloads/c/no_frame_pointers.c loads with dlopen in its "dlopen" mode, built
 * with `gcc -O2 -fomit-frame-pointer -shared -fPIC`: library_leaf <- library_work, called from
 * the program's main through a pointer dlsym returned. */
__attribute__((noinline, noipa)) unsigned long library_leaf(unsigned long x)
{
    for (int round = 0; round < 64; round++)
        x = (x ^ (x >> 31)) * 0x94d049bb133111ebul;
    return x;
}

__attribute__((noinline, noipa)) unsigned long library_work(double deadline, double (*now)(void))
{
    unsigned long x = 1;
    while (now() < deadline)
        for (int i = 0; i < 1000; i++)
            x = library_leaf(x);
    return x;
}
