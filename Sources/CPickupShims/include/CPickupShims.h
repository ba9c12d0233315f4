#ifndef CPICKUP_SHIMS_H
#define CPICKUP_SHIMS_H
#include <stddef.h>
#include <sys/types.h>

/// Sets an extended attribute on an open file; returns 0 or -1 with errno set.
int pickup_fsetxattr(int fd, const char *name, const void *value, size_t size);
/// Reads an extended attribute of an open file; returns its size, or -1 with errno set.
ssize_t pickup_fgetxattr(int fd, const char *name, void *value, size_t size);
/// Renames `from` (relative to `fromdir`) to `to` (relative to `todir`) unless something is at
/// `to` (then -1 with errno EEXIST), in one atomic step; -1 with errno ENOSYS, EINVAL or ENOTSUP
/// where the platform or file system cannot.
int pickup_renameat_noreplace(int fromdir, const char *from, int todir, const char *to);
/// `openat` with a mode (the C function is variadic, which Swift cannot call directly).
int pickup_openat(int dirfd, const char *path, int flags, unsigned int mode);
/// Starts writing a file's dirty pages to disk without waiting for them (Linux
/// `sync_file_range(SYNC_FILE_RANGE_WRITE)`; elsewhere nothing), so that a later fsync has less to wait for.
int pickup_start_writeback(int fd);
/// Maps `length` bytes of `fd` shared, read and write, and guards the mapping: a SIGBUS inside it
/// (the file was cut short under the mapping, or its blocks could not be allocated) replaces the
/// faulting page with anonymous memory instead of ending the process, and is counted. Returns the
/// address, or NULL with errno set. The first call installs the SIGBUS handler; a fault outside
/// every guarded mapping goes to the handler that was there before (or the default action).
void *pickup_map_guarded(int fd, size_t length);
/// Unmaps a mapping made by `pickup_map_guarded`.
void pickup_unmap_guarded(void *base, size_t length);
/// How many faults in guarded mappings were absorbed since the process started.
long pickup_guarded_faults(void);
/// The size of the terminal at `fd` (TIOCGWINSZ): 0 with its columns and rows, or -1 with errno
/// set (not a terminal).
int pickup_terminal_size(int fd, int *columns, int *rows);
#endif
