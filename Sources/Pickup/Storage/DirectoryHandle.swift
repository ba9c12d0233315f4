import CPickupShims
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An open download directory: every file operation in it (open, stat, rename, link, unlink,
/// fsync of the directory) goes through its descriptor with a single-component name and never
/// follows a symlink at that name. A symlink planted at a helper file's name, or a directory on
/// the way swapped after a check, cannot redirect a write, a rename or a delete.
///
/// The directory itself is opened once per run: as the user named it, or, under a confining
/// root (the daemon's download root), one component at a time from the root without following
/// any symlink.
public final class DirectoryHandle: Sendable {
    /// The directory's path, for messages and for building the final path.
    public let path: FilePath
    let fd: Int32

    private init(path: FilePath, fd: Int32) {
        self.path = path
        self.fd = fd
    }

    deinit { _ = systemClose(fd) }

    /// Opens `directory`, creating it (and its parents) when `create` is set. With `root`, the
    /// directory must lie lexically inside it; every component below `root` is opened (and
    /// created) relative to the one before with `O_NOFOLLOW`, so no symlink below the root is ever
    /// followed, whenever it was planted.
    public static func open(_ directory: FilePath, under root: FilePath? = nil, create: Bool) throws(PickupError)
        -> DirectoryHandle
    {
        guard let root else {
            if create { try FS.makeDirectories(directory) }
            let fd = pickup_openat(AT_FDCWD, directory.string, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0)
            guard fd >= 0 else { throw .fileSystem(directory.string, Errno(rawValue: errno)) }
            return DirectoryHandle(path: directory, fd: fd)
        }
        var rest = directory.lexicallyNormalized()
        guard rest.removePrefix(root.lexicallyNormalized()) else {
            throw .invalidInput("\(directory) is outside the download root \(root)")
        }
        var fd = pickup_openat(AT_FDCWD, root.string, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0)
        guard fd >= 0 else { throw .fileSystem(root.string, Errno(rawValue: errno)) }
        var walked = root
        for component in rest.components {
            let name = component.string
            walked.append(component)
            guard name != "..", name != "." else {
                _ = systemClose(fd)
                throw .invalidInput("\(directory) leaves the download root \(root)")
            }
            if create, mkdirat(fd, name, 0o755) != 0, errno != EEXIST {
                let e = errno
                _ = systemClose(fd)
                throw .fileSystem(walked.string, Errno(rawValue: e))
            }
            let next = pickup_openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0)
            let e = errno
            _ = systemClose(fd)
            guard next >= 0 else {
                if e == ELOOP || e == ENOTDIR {
                    throw .invalidInput("\(walked) is a symbolic link or not a directory; refusing to follow it out of the download root")
                }
                throw .fileSystem(walked.string, Errno(rawValue: e))
            }
            fd = next
        }
        return DirectoryHandle(path: directory, fd: fd)
    }

    /// `name` must be one path component: not empty, no `/`, not `.` or `..`.
    static func check(_ name: String) throws(PickupError) {
        guard !name.isEmpty, name != ".", name != "..", !name.utf8.contains(UInt8(ascii: "/")),
            !name.utf8.contains(0)
        else { throw .invalidInput("'\(name)' is not a plain file name") }
    }

    /// The path of `name` in this directory, for messages and results.
    public func pathOf(_ name: String) -> FilePath { path.appending(name) }

    /// Opens a regular file in this directory, never through a symlink at `name` (ELOOP is
    /// reported as such); `exclusive` creates it new (`O_EXCL`). Anything but a regular file is
    /// refused (a FIFO or device could block or swallow the bytes).
    func openFile(_ name: String, write: Bool, create: Bool = false, exclusive: Bool = false, truncate: Bool = false,
                  mode: UInt32 = 0o644) throws(PickupError) -> FileDescriptor
    {
        try Self.check(name)
        var flags = (write ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK
        if create { flags |= O_CREAT }
        if exclusive { flags |= O_EXCL }
        if truncate { flags |= O_TRUNC }
        let fd = pickup_openat(self.fd, name, flags, mode)
        guard fd >= 0 else {
            let e = errno
            if e == ELOOP || e == EMLINK {
                // A file-system matter (exit 6, as documented), said as such.
                throw .fileSystem(pathOf(name).string, .tooManySymbolicLinkLevels)
            }
            throw .fileSystem(pathOf(name).string, Errno(rawValue: e))
        }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else {
            _ = systemClose(fd)
            throw .invalidInput("\(pathOf(name)) is not a regular file")
        }
        // Back to blocking I/O (O_NONBLOCK was only there so that opening a FIFO cannot hang).
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)
        return FileDescriptor(rawValue: fd)
    }

    /// The names in the directory (not `.` and `..`), at most `limit` of them, in no order.
    func entries(limit: Int = 1_000_000) -> [String] {
        let copy = dup(fd)
        guard copy >= 0 else { return [] }
        guard let dir = fdopendir(copy) else {
            _ = systemClose(copy)
            return []
        }
        defer { closedir(dir) }
        rewinddir(dir)
        var names: [String] = []
        while names.count < limit, let entry = readdir(dir) {
            let name = withUnsafePointer(to: &entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: MemoryLayout.size(ofValue: entry.pointee.d_name)) { String(cString: $0) }
            }
            if name != ".", name != ".." { names.append(name) }
        }
        return names
    }

    /// What is at `name`, without following a symlink there; nil when nothing is.
    func status(_ name: String) -> stat? {
        var st = stat()
        return fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? st : nil
    }

    /// Whether anything (a file, a directory, a symlink, even a dangling one) is at `name`.
    func exists(_ name: String) -> Bool { status(name) != nil }

    /// The size of the regular file at `name`; nil when there is none (a symlink is none).
    func size(_ name: String) -> Int64? {
        guard let st = status(name), (st.st_mode & S_IFMT) == S_IFREG else { return nil }
        return Int64(st.st_size)
    }

    /// Whether `name` is a directory (not a symlink to one).
    func isDirectory(_ name: String) -> Bool {
        guard let st = status(name) else { return false }
        return (st.st_mode & S_IFMT) == S_IFDIR
    }

    /// Removes the entry `name` (a symlink itself, never what it points to); silent when absent.
    func remove(_ name: String) {
        guard (try? Self.check(name)) != nil else { return }
        _ = unlinkat(fd, name, 0)
    }

    /// A small regular file's bytes (at most `limit`), opened without following a symlink; nil
    /// when missing, not a regular file, or larger.
    func readFile(_ name: String, limit: Int = 1 << 20) -> [UInt8]? {
        guard let fd = try? openFile(name, write: false) else { return nil }
        defer { try? fd.close() }
        return FS.readAll(fd, limit: limit)
    }

    /// Renames `from` to `to` in this directory, replacing whatever entry is at `to` (a symlink
    /// there is replaced, never followed).
    func rename(_ from: String, to: String) throws(PickupError) {
        try Self.check(from)
        try Self.check(to)
        if renameat(fd, from, fd, to) != 0 { throw .fileSystem(pathOf(to).string, Errno(rawValue: errno)) }
    }

    /// Moves `from` to `to` only if nothing is at `to`: an exclusive rename where the platform
    /// has one, else a hard link then unlink (atomic too, never replaces), else a checked rename on
    /// file systems without hard links.
    func moveNoReplace(_ from: String, to: String) throws(PickupError) {
        try Self.check(from)
        try Self.check(to)
        if pickup_renameat_noreplace(fd, from, fd, to) == 0 { return }
        if errno == EEXIST { throw .targetExists(pathOf(to).string) }
        if linkat(fd, from, fd, to, 0) == 0 {
            _ = unlinkat(fd, from, 0)
            return
        }
        if errno == EEXIST || exists(to) { throw .targetExists(pathOf(to).string) }
        try rename(from, to: to)
    }

    /// Replaces the file `name` whole: a new temp file (never through a symlink: any entry at its
    /// name is removed first and the file is created exclusively, mode 0600), fsync, rename over
    /// `name`, fsync of the directory (without the fsyncs unless `durable`). Blocking calls.
    /// `barrier`: the fsyncs order rather than flush (see ``FS/fsync(_:barrier:)``).
    /// `excludedFromBackup`: the new file is marked as one backups skip (``BackupExclusion``).
    package func replaceFile(_ name: String, with bytes: [UInt8], durable: Bool = true, barrier: Bool = false,
                             excludedFromBackup: Bool = false) throws(PickupError) {
        let tmp = name + ".tmp"
        remove(tmp)
        let fd = try openFile(tmp, write: true, create: true, exclusive: true, mode: 0o600)
        do {
            defer { try? fd.close() }
            if excludedFromBackup { BackupExclusion.mark(fd, excluded: true) }
            _ = try fd.writeAll(bytes)
            if durable { try FS.fsync(fd, barrier: barrier) }
        } catch {
            remove(tmp)
            throw .io(pathOf(tmp).string, error)
        }
        try rename(tmp, to: name)
        if durable { sync(barrier: barrier) }
    }

    /// Makes the directory's entries (creates, renames, unlinks) durable: returns once an fsync of
    /// the directory that started after this call has ended, shared with the other downloads
    /// finishing in it at the same time (``DirectorySync``).
    func sync(barrier: Bool = false) {
        guard let key = DirectorySync.key(of: fd, barrier: barrier) else {
            try? FS.fsync(FileDescriptor(rawValue: fd), barrier: barrier)
            return
        }
        DirectorySync.shared.sync(fd, key: key)
    }
}

@inline(__always) func systemClose(_ fd: Int32) -> Int32 {
    #if canImport(Glibc)
    return Glibc.close(fd)
    #else
    return Darwin.close(fd)
    #endif
}
