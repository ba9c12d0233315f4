import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An unfinished download found in a directory: its helper files (`NAME.pickup-part`,
/// `.pickup-ctl`, `.pickup-pos`) and what its control file says of it.
public struct UnfinishedDownload: Sendable, Equatable {
    /// The name the helper files share, less their suffixes (`NAME`, or `.pickup-HASH` until the
    /// server has named the file).
    public var base: String
    /// The helper files there, by name.
    public var files: [String]
    /// The file's name once finished, when known.
    public var name: String?
    /// The URL, without credentials; nil when no control file could be read.
    public var url: String?
    /// Bytes the control file vouches for.
    public var bytesHeld: Int64
    /// The complete length, when known.
    public var totalBytes: Int64?
    /// Bytes the helper files take on disk.
    public var diskBytes: Int64
    /// A run of it holds its partial file's lock now (a `pickup` or a manager downloading it).
    public var inUse: Bool
}

/// Lists and removes the unfinished downloads in a directory (`pickup partials`, `pickup clean`):
/// only Pickup's helper files, through the directory's handle, never following a symlink. Blocking
/// calls: off Swift's cooperative pool.
public enum UnfinishedDownloads {
    /// The helper files' suffixes, the longest first (`.pickup-ctl.tmp` before `.pickup-ctl`).
    static let suffixes = [SafeFileName.controlSuffix + ".tmp", SafeFileName.partialSuffix, SafeFileName.controlSuffix,
                           SafeFileName.cursorSuffix]

    /// The unfinished downloads in `directory`, by name.
    /// - Throws: ``PickupError`` when the directory cannot be opened.
    public static func list(in directory: FilePath) throws(PickupError) -> [UnfinishedDownload] {
        let dir = try DirectoryHandle.open(directory, create: false)
        var groups: [String: [String]] = [:]
        for name in dir.entries() {
            guard let suffix = suffixes.first(where: { name.hasSuffix($0) && name.count > $0.count }) else { continue }
            groups[String(name.dropLast(suffix.count)), default: []].append(name)
        }
        return groups.map { base, files in describe(base, files: files.sorted(), in: dir) }
            .sorted { ($0.name ?? $0.base) < ($1.name ?? $1.base) }
    }

    static func describe(_ base: String, files: [String], in dir: DirectoryHandle) -> UnfinishedDownload {
        let record = ControlFile.load(base + SafeFileName.controlSuffix, in: dir)
        let hashed = base.hasPrefix(".pickup-")
        let target = record?.target.flatMap { FilePath($0).lastComponent?.string }
        let disk = files.reduce(Int64(0)) { sum, f in
            guard let st = dir.status(f), (st.st_mode & S_IFMT) == S_IFREG else { return sum }
            return sum + Int64(st.st_blocks) * 512
        }
        var inUse = false
        if files.contains(base + SafeFileName.partialSuffix) {
            withLock(base, in: dir) { locked in inUse = !locked }
        }
        return UnfinishedDownload(base: base, files: files, name: hashed ? target : base, url: record.map { DownloadURL.redacted($0.url) },
                                  bytesHeld: record?.durableBytes ?? 0, totalBytes: record?.totalLength, diskBytes: disk, inUse: inUse)
    }

    /// Runs `body` with whether this process holds the lock of `base`'s partial file (another
    /// run holds it: false), the lock held meanwhile.
    /// (Opened read-only, which a lock needs no more than; a partial file that is there but cannot
    /// be opened, another user's, counts as held.)
    static func withLock(_ base: String, in dir: DirectoryHandle, _ body: (Bool) -> Void) {
        let name = base + SafeFileName.partialSuffix
        let fd: FileDescriptor
        do {
            fd = try dir.openFile(name, write: false)
        } catch {
            return body(!dir.exists(name))
        }
        defer { try? fd.close() }
        body(flock(fd.rawValue, LOCK_EX | LOCK_NB) == 0)
    }

    /// Removes `download`'s helper files from `directory`, unless a run holds its partial file's
    /// lock (then false: nothing is removed). Only the names listed; a symlink is removed itself,
    /// never what it points to.
    /// - Throws: ``PickupError`` when the directory cannot be opened.
    @discardableResult
    public static func remove(_ download: UnfinishedDownload, in directory: FilePath) throws(PickupError) -> Bool {
        let dir = try DirectoryHandle.open(directory, create: false)
        let base = download.base
        // (One path component, or nothing: a base from elsewhere never reaches into another directory.)
        guard (try? DirectoryHandle.check(base + SafeFileName.partialSuffix)) != nil else { return false }
        var removed = false
        withLock(base, in: dir) { locked in
            guard locked else { return }
            // The control file first: a partial file without one is never resumed from.
            for suffix in [SafeFileName.controlSuffix, SafeFileName.controlSuffix + ".tmp", SafeFileName.cursorSuffix,
                           SafeFileName.partialSuffix] {
                dir.remove(base + suffix)
            }
            dir.sync()
            removed = true
        }
        return removed
    }
}
