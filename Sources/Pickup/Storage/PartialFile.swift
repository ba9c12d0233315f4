import Atomics
import CPickupShims
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The file that holds a download's bytes while it is unfinished: positional writes from any
/// thread, fsync, truncation and preallocation.
///
/// Writes go straight to the descriptor with `pwrite`, so several connections can fill their own
/// ranges of the same file without coordination and without copying.
public final class PartialFile: Sendable {
    /// Where the file is.
    public let path: FilePath
    let fd: FileDescriptor
    private let closed = ManagedAtomic(false)

    /// Opens (creating if needed, unless `create` is false) `name` in `directory` for reading and
    /// writing, without truncating it and never through a symlink at that name.
    init(in directory: DirectoryHandle, name: String, create: Bool = true) throws(PickupError) {
        path = directory.pathOf(name)
        fd = try directory.openFile(name, write: true, create: create)
    }

    /// Opens (creating if needed) the file at `path` for reading and writing, without truncating
    /// it (files of Pickup's own state directory).
    public init(path: FilePath) throws(PickupError) {
        self.path = path
        do {
            fd = try FileDescriptor.open(
                path, .readWrite, options: [.create, .closeOnExec], permissions: [.ownerReadWrite, .groupRead, .otherRead])
        } catch {
            throw .io(path.string, error)
        }
    }

    /// Marks the file as one that backups skip, or not (``BackupExclusion``): a partial file is;
    /// the mark is taken off before the finishing rename.
    func setExcludedFromBackup(_ excluded: Bool) {
        BackupExclusion.mark(fd, excluded: excluded)
    }

    /// Writes all of `bytes` at `offset`. This is the per-chunk path: no allocation.
    @inline(__always)
    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws(Errno) {
        try TestFaults.check(.write, amount: Int64(bytes.count))
        var done = 0
        while done < bytes.count {
            let n: Int
            do {
                n = try fd.write(toAbsoluteOffset: offset + Int64(done), UnsafeRawBufferPointer(rebasing: bytes[done...]))
            } catch {
                throw (error as? Errno) ?? .ioError
            }
            if n == 0 { throw Errno.noSpace }
            done += n
        }
    }

    /// Makes every byte written so far durable (`barrier`: ordered before what is written after,
    /// see ``FS/fsync(_:barrier:)``).
    public func sync(barrier: Bool = false) throws(PickupError) {
        do {
            try TestFaults.check(.sync)
            try FS.fsync(fd, barrier: barrier)
        } catch { throw .io(path.string, error) }
    }

    /// Starts writing the dirty pages to disk, not waiting for them (write-behind: the fsync at a
    /// checkpoint or at the end then has little left to wait for). Does nothing where the
    /// platform has no such call.
    func startWriteback() {
        _ = pickup_start_writeback(fd.rawValue)
    }

    /// The current size on disk.
    public func size() throws(PickupError) -> Int64 {
        do {
            return try fd.seek(offset: 0, from: .end)
        } catch {
            throw .io(path.string, error)
        }
    }

    /// Cuts or extends the file to `length` bytes.
    public func truncate(to length: Int64) throws(PickupError) {
        do {
            try TestFaults.check(.truncate)
            try fd.resize(to: length)
        } catch { throw .io(path.string, error) }
    }

    /// Reserves `length` bytes on disk so that a full disk is reported at the start, not at 99 %:
    /// `posix_fallocate` on Linux, `F_PREALLOCATE` (contiguous first, then any blocks) on Apple
    /// platforms, then the file is extended to `length` with `ftruncate` where it is shorter.
    public func preallocate(_ length: Int64) throws(PickupError) {
        #if os(Linux)
        let r = posix_fallocate(fd.rawValue, 0, off_t(length))
        if r == 0 { return }
        if r == ENOSPC { throw .fileSystem(path.string, Errno.noSpace) }
        #elseif canImport(Darwin)
        let current = try size()
        if current < length {
            var store = fstore_t(fst_flags: UInt32(F_ALLOCATECONTIG | F_ALLOCATEALL), fst_posmode: F_PEOFPOSMODE,
                                 fst_offset: 0, fst_length: off_t(length - current), fst_bytesalloc: 0)
            var r = fcntl(fd.rawValue, F_PREALLOCATE, &store)
            if r == -1 {
                store.fst_flags = UInt32(F_ALLOCATEALL)
                r = fcntl(fd.rawValue, F_PREALLOCATE, &store)
            }
            if r == -1 && errno == ENOSPC { throw .fileSystem(path.string, Errno.noSpace) }
        }
        #endif
        if try size() < length { try truncate(to: length) }
    }

    /// Takes an exclusive advisory lock for as long as the file is open (the kernel drops it when
    /// the process ends, kill -9 included). False when another process holds it.
    public func lock() -> Bool {
        flock(fd.rawValue, LOCK_EX | LOCK_NB) == 0
    }

    /// ``lock()``, asked again every 10 ms for up to `seconds` (a blocking wait, only while another
    /// holds the lock).
    func lock(within seconds: Double) -> Bool {
        for _ in 0..<max(1, Int(min(seconds, 60) * 100)) {
            if lock() { return true }
            usleep(10_000)
        }
        return lock()
    }

    /// Closes the descriptor (once, however often it is called: a second close could close a
    /// descriptor number the process has reused); the file stays.
    public func close() {
        if !closed.exchange(true, ordering: .acquiringAndReleasing) { try? fd.close() }
    }
}

/// Small file-system helpers with the same error type as the rest of the engine.
package enum FS {

    /// fsync, or on Apple platforms F_FULLFSYNC, which also flushes the drive's cache. `barrier`
    /// (a periodic checkpoint, which needs its writes ordered, not flushed): on Apple platforms
    /// F_BARRIERFSYNC, whose writes reach the disk after every write before it and which costs no
    /// cache flush (a phone's battery); where it fails, F_FULLFSYNC. Elsewhere fsync either way.
    package static func fsync(_ fd: FileDescriptor, barrier: Bool = false) throws(Errno) {
        #if canImport(Darwin)
        if barrier, fcntl(fd.rawValue, F_BARRIERFSYNC) == 0 { return }
        if fcntl(fd.rawValue, F_FULLFSYNC) == 0 { return }
        if Darwin.fsync(fd.rawValue) != 0 { throw Errno(rawValue: errno) }
        #else
        if Glibc.fsync(fd.rawValue) != 0 { throw Errno(rawValue: errno) }
        #endif
    }

    static func isDirectory(_ path: FilePath) -> Bool {
        var st = stat()
        return stat(path.string, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR
    }

    static func size(_ path: FilePath) -> Int64? {
        var st = stat()
        guard stat(path.string, &st) == 0 else { return nil }
        return Int64(st.st_size)
    }

    /// Modification time of an open file in nanoseconds since the epoch.
    static func mtime(_ fd: FileDescriptor) -> Int64? {
        var st = stat()
        guard fstat(fd.rawValue, &st) == 0 else { return nil }
        return mtime(st)
    }

    private static func mtime(_ st: stat) -> Int64 {
        #if canImport(Darwin)
        return Int64(st.st_mtimespec.tv_sec) * 1_000_000_000 + Int64(st.st_mtimespec.tv_nsec)
        #else
        return Int64(st.st_mtim.tv_sec) * 1_000_000_000 + Int64(st.st_mtim.tv_nsec)
        #endif
    }

    static func remove(_ path: FilePath) {
        _ = unlink(path.string)
    }

    /// A small file's bytes (at most `limit`); nil when it cannot be opened or is larger. Plain
    /// `open`/`read`: FileManager builds an error object for every missing file, and most of the
    /// files looked for here (control files, index entries) are missing.
    static func readFile(_ path: FilePath, limit: Int = 1 << 20) -> [UInt8]? {
        guard let fd = try? FileDescriptor.open(path, .readOnly, options: [.closeOnExec]) else { return nil }
        defer { try? fd.close() }
        return readAll(fd, limit: limit)
    }

    /// The first `count` bytes of a file (fewer if it is shorter); nil when it cannot be read.
    static func readPrefix(_ path: FilePath, count: Int) -> [UInt8]? {
        guard let fd = try? FileDescriptor.open(path, .readOnly, options: [.closeOnExec]) else { return nil }
        defer { try? fd.close() }
        var bytes = [UInt8](repeating: 0, count: count)
        guard let n = try? bytes.withUnsafeMutableBytes({ try fd.read(into: $0) }) else { return nil }
        return Array(bytes.prefix(n))
    }

    /// What is left to read of an open file (at most `limit` bytes); nil on an error or when larger.
    static func readAll(_ fd: FileDescriptor, limit: Int) -> [UInt8]? {
        var bytes: [UInt8] = []
        var chunk = 16384
        while true {
            let start = bytes.count
            bytes.append(contentsOf: repeatElement(0, count: chunk))
            let n = (try? bytes.withUnsafeMutableBytes { try fd.read(into: UnsafeMutableRawBufferPointer(rebasing: $0[start...])) }) ?? -1
            guard n >= 0 else { return nil }
            bytes.removeLast(chunk - n)
            if n == 0 { return bytes }
            guard bytes.count <= limit else { return nil }
            chunk = min(chunk * 2, 1 << 20)
        }
    }

    static func makeDirectories(_ path: FilePath) throws(PickupError) {
        if isDirectory(path) { return }
        let parent = path.removingLastComponent()
        if parent != path, !parent.isEmpty { try makeDirectories(parent) }
        if mkdir(path.string, 0o755) != 0 && errno != EEXIST {
            throw .fileSystem(path.string, Errno(rawValue: errno))
        }
    }
}

