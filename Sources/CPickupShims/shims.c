#include "CPickupShims.h"
#include <errno.h>
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
