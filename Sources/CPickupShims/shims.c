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
