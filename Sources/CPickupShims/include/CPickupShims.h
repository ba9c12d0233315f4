#ifndef CPICKUP_SHIMS_H
#define CPICKUP_SHIMS_H
#include <stddef.h>
#include <sys/types.h>

/// Sets an extended attribute on an open file; returns 0 or -1 with errno set.
int pickup_fsetxattr(int fd, const char *name, const void *value, size_t size);
/// Reads an extended attribute of a path; returns its size, or -1 with errno set.
ssize_t pickup_getxattr(const char *path, const char *name, void *value, size_t size);
/// Renames `from` to `to` unless something is at `to` (then -1 with errno EEXIST), in one atomic
/// step; -1 with errno ENOSYS, EINVAL or ENOTSUP where the platform or file system cannot.
int pickup_rename_noreplace(const char *from, const char *to);
#endif
