/* no_vm_clone: run a program where a clone that shares memory without being a thread
 * (CLONE_VM without CLONE_THREAD) fails with EINVAL, as under an emulator or a sandbox that
 * allows only threads and forks (qemu-user), then exec it:
 *
 *   no_vm_clone PROG ARGS...
 *
 * A seccomp filter (inherited across exec; no_new_privs set first, so no privilege is
 * needed) answers the `clone` system call with those flags EINVAL; threads (CLONE_THREAD)
 * and forks (no CLONE_VM) pass, as does everything else. python-tests/
 * test_launch_exec_failure.py starts `rankguard launch` under it: the launcher forks its
 * ranks instead (src/cli/rank_start.rs). Exit 127 if PROG cannot be exec'ed, 2 if the
 * filter cannot be installed. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "no_vm_clone: add this architecture's AUDIT_ARCH"
#endif

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: no_vm_clone PROG ARGS...\n");
        return 2;
    }
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* The flags' low 32 bits (both architectures are little-endian). */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, CLONE_VM | CLONE_THREAD),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CLONE_VM, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("no_vm_clone: installing the seccomp filter");
        return 2;
    }
    execvp(argv[1], argv + 1);
    perror("no_vm_clone: exec");
    return 127;
}
