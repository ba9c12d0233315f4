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
ssize_t pickup_getxattr(const char *path, const char *name, void *value, size_t size) {
    return getxattr(path, name, value, size, 0, 0);
}
#elif defined(__linux__)
#include <sys/xattr.h>
int pickup_fsetxattr(int fd, const char *name, const void *value, size_t size) {
    return fsetxattr(fd, name, value, size, 0);
}
ssize_t pickup_getxattr(const char *path, const char *name, void *value, size_t size) {
    return getxattr(path, name, value, size);
}
#else
int pickup_fsetxattr(int fd, const char *name, const void *value, size_t size) { errno = ENOTSUP; return -1; }
ssize_t pickup_getxattr(const char *path, const char *name, void *value, size_t size) { errno = ENOTSUP; return -1; }
#endif

#if defined(__APPLE__)
int pickup_rename_noreplace(const char *from, const char *to) {
    return renamex_np(from, to, RENAME_EXCL);
}
#elif defined(__linux__) && defined(RENAME_NOREPLACE)
int pickup_rename_noreplace(const char *from, const char *to) {
    return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
}
#else
int pickup_rename_noreplace(const char *from, const char *to) { errno = ENOSYS; return -1; }
#endif
