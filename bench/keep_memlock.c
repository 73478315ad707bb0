/* keep_memlock COMMAND [ARGS...]: runs COMMAND with raising RLIMIT_MEMLOCK answered as done and
 * nothing else changed (a seccomp filter on prlimit64/setrlimit of that one resource).
 *
 * The bench runs the OpenTelemetry eBPF profiler under it: the profiler raises its memlock limit
 * before loading its programs and gives up when it cannot, as on machines whose hard limit is
 * low and where CAP_SYS_RESOURCE is not held. Since Linux 5.11 the kernel charges BPF maps to
 * the memory cgroup and reads no memlock limit, so the answer changes nothing the profiler does
 * (xtask/src/bench/fleet.rs). */
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define THIS_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define THIS_ARCH AUDIT_ARCH_AARCH64
#else
#error "keep_memlock: x86-64 or aarch64"
#endif

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: keep_memlock COMMAND [ARGS...]\n");
        return 2;
    }
    struct sock_filter filter[] = {
        /* Another architecture's system calls (a 32-bit entry) pass untouched. */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, THIS_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_prlimit64, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_setrlimit, 3, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* prlimit64(pid, resource, new, old): the resource is the second argument. */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JA, 1, 0, 0),
        /* setrlimit(resource, new): the first. */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, RLIMIT_MEMLOCK, 0, 1),
        /* Errno 0: the call returns 0 without running. */
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {
        .len = sizeof(filter) / sizeof(filter[0]),
        .filter = filter,
    };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program)) {
        perror("keep_memlock: seccomp");
        return 1;
    }
    execvp(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
