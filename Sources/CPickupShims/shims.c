#if defined(__linux__)
#define _GNU_SOURCE
#endif
#include "CPickupShims.h"
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#if defined(__APPLE__)
#include <sys/xattr.h>
int pickup_fsetxattr(int fd, const char *name, const void *value, size_t size) {
    return fsetxattr(fd, name, value, size, 0, 0);
}
ssize_t pickup_fgetxattr(int fd, const char *name, void *value, size_t size) {
    return fgetxattr(fd, name, value, size, 0, 0);
}
#elif defined(__linux__)
#include <sys/xattr.h>
int pickup_fsetxattr(int fd, const char *name, const void *value, size_t size) {
    return fsetxattr(fd, name, value, size, 0);
}
ssize_t pickup_fgetxattr(int fd, const char *name, void *value, size_t size) {
    return fgetxattr(fd, name, value, size);
}
#else
int pickup_fsetxattr(int fd, const char *name, const void *value, size_t size) { errno = ENOTSUP; return -1; }
ssize_t pickup_fgetxattr(int fd, const char *name, void *value, size_t size) { errno = ENOTSUP; return -1; }
#endif

#if defined(__APPLE__)
int pickup_renameat_noreplace(int fromdir, const char *from, int todir, const char *to) {
    return renameatx_np(fromdir, from, todir, to, RENAME_EXCL);
}
#elif defined(__linux__) && defined(RENAME_NOREPLACE)
int pickup_renameat_noreplace(int fromdir, const char *from, int todir, const char *to) {
    return renameat2(fromdir, from, todir, to, RENAME_NOREPLACE);
}
#else
int pickup_renameat_noreplace(int fromdir, const char *from, int todir, const char *to) { errno = ENOSYS; return -1; }
#endif

int pickup_openat(int dirfd, const char *path, int flags, unsigned int mode) {
    return openat(dirfd, path, flags, (mode_t)mode);
}


#if defined(__linux__)
int pickup_start_writeback(int fd) { return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); }
#else
int pickup_start_writeback(int fd) { (void)fd; return 0; }
#endif

// MARK: - Guarded mappings (the cursor file)

#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <pthread.h>

#define PICKUP_GUARD_SLOTS 256
static _Atomic(uintptr_t) guard_base[PICKUP_GUARD_SLOTS];
static _Atomic(uintptr_t) guard_length[PICKUP_GUARD_SLOTS];
static _Atomic(long) guard_faults;
static uintptr_t guard_page_size = 4096;
static struct sigaction guard_previous;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;

static void pickup_sigbus(int sig, siginfo_t *info, void *context) {
    uintptr_t address = (uintptr_t)info->si_addr;
    for (int i = 0; i < PICKUP_GUARD_SLOTS; i++) {
        uintptr_t base = atomic_load(&guard_base[i]);
        uintptr_t length = atomic_load(&guard_length[i]);
        if (base != 0 && address >= base && address - base < length) {
            uintptr_t page = address & ~(guard_page_size - 1);
            void *p = mmap((void *)page, guard_page_size, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANON | MAP_FIXED, -1, 0);
            if (p != MAP_FAILED) {
                atomic_fetch_add(&guard_faults, 1);
                return;  // the faulting access runs again, on the anonymous page
            }
        }
    }
    // Not ours: what was there before handles it.
    if ((guard_previous.sa_flags & SA_SIGINFO) && guard_previous.sa_sigaction != NULL) {
        guard_previous.sa_sigaction(sig, info, context);
        return;
    }
    if (guard_previous.sa_handler != SIG_DFL && guard_previous.sa_handler != SIG_IGN && guard_previous.sa_handler != NULL) {
        guard_previous.sa_handler(sig);
        return;
    }
    // The default action: restore it and return; the access faults again and ends the process.
    sigaction(SIGBUS, &guard_previous, NULL);
}

static void pickup_install_guard(void) {
    long size = sysconf(_SC_PAGESIZE);
    if (size > 0) guard_page_size = (uintptr_t)size;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = pickup_sigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &guard_previous);
}

void *pickup_map_guarded(int fd, size_t length) {
    pthread_once(&guard_once, pickup_install_guard);
    int slot = -1;
    for (int i = 0; i < PICKUP_GUARD_SLOTS; i++) {
        uintptr_t expected = 0;
        // Reserve the slot with a placeholder so that two threads never take the same one.
        if (atomic_compare_exchange_strong(&guard_base[i], &expected, (uintptr_t)1)) { slot = i; break; }
    }
    if (slot < 0) { errno = ENOMEM; return NULL; }
    void *p = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        atomic_store(&guard_base[slot], 0);
        return NULL;
    }
    atomic_store(&guard_length[slot], (uintptr_t)length);
    atomic_store(&guard_base[slot], (uintptr_t)p);
    return p;
}

void pickup_unmap_guarded(void *base, size_t length) {
    for (int i = 0; i < PICKUP_GUARD_SLOTS; i++) {
        if (atomic_load(&guard_base[i]) == (uintptr_t)base) {
            munmap(base, length);
            atomic_store(&guard_length[i], 0);
            atomic_store(&guard_base[i], 0);
            return;
        }
    }
    munmap(base, length);
}

long pickup_guarded_faults(void) { return atomic_load(&guard_faults); }

#include <sys/ioctl.h>
int pickup_terminal_size(int fd, int *columns, int *rows) {
    struct winsize w;
    if (ioctl(fd, TIOCGWINSZ, &w) != 0) return -1;
    *columns = w.ws_col;
    *rows = w.ws_row;
    return 0;
}
