/* Counts fsync/fdatasync calls of a process, for bench/ledger.py (LD_PRELOAD).
 * Interposing the libc calls costs nothing measurable, unlike tracing every thread. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>

static atomic_long calls;

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    atomic_fetch_add(&calls, 1);
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    atomic_fetch_add(&calls, 1);
    return real(fd);
}

long reveille_fsync_calls(void) { return atomic_load(&calls); }
