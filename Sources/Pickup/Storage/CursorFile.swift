import Atomics
import CPickupShims
import Crypto
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Which boot of the machine this is. Bytes written but not fsynced survive a killed process (the
/// page cache keeps them) but not a power loss or a kernel crash, after which the machine boots
/// anew: progress recorded without fsync is trusted only by a run of the same boot.
enum BootID {
    /// 16 bytes naming this boot, or nil when the system does not say (then nothing unsynced is
    /// ever trusted): Linux `/proc/sys/kernel/random/boot_id`, Darwin `kern.bootsessionuuid`.
    /// `PICKUP_TEST_BOOT_SALT` is mixed in, so that a test can simulate a reboot; it can only make
    /// a boot look new, never an old one current.
    static let current: [UInt8]? = {
        var text: String? = nil
        #if os(Linux)
        text = FS.readFile("/proc/sys/kernel/random/boot_id", limit: 256).map { String(decoding: $0, as: UTF8.self) }
        #elseif canImport(Darwin)
        var size = 0
        if sysctlbyname("kern.bootsessionuuid", nil, &size, nil, 0) == 0, size > 0, size < 256 {
            var buffer = [CChar](repeating: 0, count: size)
            if sysctlbyname("kern.bootsessionuuid", &buffer, &size, nil, 0) == 0 {
                text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            }
        }
        #endif
        guard let id = text?.trimmingSpaces, !id.isEmpty else { return nil }
        let salt = getenv("PICKUP_TEST_BOOT_SALT").map { String(cString: $0) } ?? ""
        return Array(SHA256.hash(data: Array((id + "\u{0}" + salt).utf8)).prefix(16))
    }()
}

extension String {
    fileprivate var trimmingSpaces: String {
        String(decoding: Array(utf8).drop { $0 == 32 || $0 == 10 }.reversed().drop { $0 == 32 || $0 == 10 }.reversed(),
               as: UTF8.self)
    }
}

/// Where every range's writer is, in a file mapped into memory beside the partial file
/// (`NAME.pickup-pos`).
///
/// Each range's ``SegmentCursor/position`` lives in a slot of this mapping, so the store that
/// publishes a chunk's progress to the engine is also its record on disk: no system call, no
/// fsync, nothing added to the per-chunk path. When the process is killed the page cache keeps
/// the slots as it keeps the bytes they describe, and the next run takes back every byte they
/// vouch for, provided the machine has not rebooted since (``BootID``) and the slots belong to
/// the control file's representation (its ``ControlRecord/epoch``). After a reboot only the
/// control file's fsynced checkpoint counts.
///
/// Layout (native byte order; the file never leaves the machine): 64 header bytes (magic,
/// epoch, boot id, slot count), then per slot the range's first byte and its writer's position.
final class CursorFile: @unchecked Sendable {
    static let magic: UInt64 = 0x5053_4F50_4B43_4950  // "PICKPOSP"
    static let slotCount = 4096
    static let headerBytes = 64
    static var byteCount: Int { headerBytes + slotCount * 16 }

    private let base: UnsafeMutableRawPointer

    private init(base: UnsafeMutableRawPointer) { self.base = base }

    deinit { pickup_unmap_guarded(base, Self.byteCount) }

    /// Maps `name` in `directory` (created, never through a symlink); nil when it cannot be
    /// (then progress is recorded by checkpoints only).
    ///
    /// A mapping is the one way a file system can trap a process (SIGBUS when a page has no
    /// block to land in, or the file is cut short under it), so:
    /// - only a file this user owns with no other name is mapped (mode 0600: another user cannot
    ///   truncate it); anything else at the name is replaced by a new file;
    /// - every block is allocated before the mapping (its content read and written back, and on
    ///   Linux `posix_fallocate`): on a full disk that fails here and the run goes on without
    ///   cursors, instead of faulting at the first store;
    /// - the mapping is guarded (`pickup_map_guarded`): should a page fault anyway (the file
    ///   truncated by its owner while mapped), the page becomes anonymous memory and the run goes
    ///   on; the next run finds the file short and trusts nothing in it.
    static func open(_ name: String, in directory: DirectoryHandle) -> CursorFile? {
        guard var fd = try? directory.openFile(name, write: true, create: true, mode: 0o600) else { return nil }
        var st = stat()
        if fstat(fd.rawValue, &st) != 0 || st.st_uid != geteuid() || st.st_nlink != 1 {
            try? fd.close()
            directory.remove(name)
            guard let fresh = try? directory.openFile(name, write: true, create: true, exclusive: true, mode: 0o600) else { return nil }
            fd = fresh
        }
        defer { try? fd.close() }
        guard let size = try? fd.seek(offset: 0, from: .end) else { return nil }
        if size != Int64(byteCount) {
            guard (try? fd.resize(to: 0)) != nil, (try? fd.resize(to: Int64(byteCount))) != nil else { return nil }
        }
        guard allocate(fd) else {
            // No room even for these 64 KiB: a file of holes would fault at the first store.
            directory.remove(name)
            return nil
        }
        BackupExclusion.mark(fd, excluded: true)
        guard let p = pickup_map_guarded(fd.rawValue, byteCount) else { return nil }
        return CursorFile(base: p)
    }

    /// Gives every page of the file a block, keeping its content; false when the file system
    /// has no room (or fails).
    private static func allocate(_ fd: FileDescriptor) -> Bool {
        do {
            try TestFaults.check(.cursor)
            #if os(Linux)
            let r = posix_fallocate(fd.rawValue, 0, off_t(byteCount))
            if r != 0 && r != EOPNOTSUPP && r != EINVAL { return false }
            #endif
            // Written back as read: blocks for every page (ext4 reserves them at the write; file
            // systems without fallocate allocate them here).
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: byteCount, alignment: 16)
            defer { buffer.deallocate() }
            let n = try fd.read(fromAbsoluteOffset: 0, into: buffer)
            guard n == byteCount else { return false }
            return try fd.writeAll(toAbsoluteOffset: 0, UnsafeRawBufferPointer(buffer)) == byteCount
        } catch {
            return false
        }
    }

    /// Header word `i` (raw loads and stores: the slots are bound to atomics as they are used).
    private func header(_ i: Int) -> UInt64 { base.load(fromByteOffset: 8 * i, as: UInt64.self) }
    private func setHeader(_ i: Int, _ value: UInt64) { base.storeBytes(of: value, toByteOffset: 8 * i, as: UInt64.self) }

    /// The written ranges the slots vouch for, if they were recorded in this boot for `epoch`;
    /// nil otherwise.
    func recovered(epoch: UInt64) -> [(start: Int64, end: Int64)]? {
        guard let boot = BootID.current, header(0) == Self.magic, header(1) == epoch,
            header(4) == UInt64(Self.slotCount), Self.bootWords(boot) == (header(2), header(3))
        else { return nil }
        var ranges: [(start: Int64, end: Int64)] = []
        for i in 0..<Self.slotCount {
            let start = base.load(fromByteOffset: Self.headerBytes + 16 * i, as: Int64.self)
            let position = base.load(fromByteOffset: Self.headerBytes + 16 * i + 8, as: Int64.self)
            if start >= 0, position > start { ranges.append((start, position)) }
        }
        return ranges
    }

    /// Empties every slot and labels the file with this boot and `epoch`. Called when no writer
    /// is running. The magic goes last: a run killed halfway leaves a file no one trusts.
    func reset(epoch: UInt64) {
        setHeader(0, 0)
        memset(base.advanced(by: Self.headerBytes), 0, Self.slotCount * 16)
        if let boot = BootID.current {
            let (a, b) = Self.bootWords(boot)
            setHeader(2, a)
            setHeader(3, b)
            setHeader(1, epoch)
            setHeader(4, UInt64(Self.slotCount))
            setHeader(0, Self.magic)
        }
    }

    /// Slot `index`: where its range's first byte goes, and its position as an atomic, set to
    /// `start` and `position`. Nil past the last slot.
    func slot(_ index: Int, start: Int64, position: Int64) -> UnsafeAtomic<Int64>? {
        guard index >= 0, index < Self.slotCount else { return nil }
        let p = base.advanced(by: Self.headerBytes + index * 16)
        p.storeBytes(of: start, as: Int64.self)
        let atomic = p.advanced(by: 8).bindMemory(to: UnsafeAtomic<Int64>.Storage.self, capacity: 1)
        atomic.initialize(to: UnsafeAtomic<Int64>.Storage(position))
        return UnsafeAtomic(at: atomic)
    }

    private static func bootWords(_ boot: [UInt8]) -> (UInt64, UInt64) {
        var a: UInt64 = 0, b: UInt64 = 0
        for i in 0..<8 {
            a = a << 8 | UInt64(boot[i])
            b = b << 8 | UInt64(boot[8 + i])
        }
        return (a, b)
    }
}

extension ControlRecord {
    /// The ranges with `written` (byte ranges known to be written in this representation, not
    /// necessarily durable) added: every byte already held or written is held in the result, each
    /// range holding a prefix of itself. Unchanged when `written` adds nothing.
    func merging(written: [(start: Int64, end: Int64)]) -> [SegmentRecord] {
        guard let total = totalLength else {
            // One open range from zero: extend its prefix through every written range that touches it.
            guard segments.count == 1, segments[0].start == 0, segments[0].end == nil else { return segments }
            var done = segments[0].done
            var grew = true
            while grew {
                grew = false
                for w in written where w.start <= done && w.end > done {
                    done = w.end
                    grew = true
                }
            }
            return [SegmentRecord(start: 0, end: nil, done: done)]
        }
        var held = segments.compactMap { s -> (start: Int64, end: Int64)? in
            s.done > 0 ? (s.start, s.start + s.done) : nil
        }
        let before = held.reduce(0) { $0 + $1.end - $1.start }
        held += written.compactMap { w -> (start: Int64, end: Int64)? in
            let a = max(0, w.start), b = min(total, w.end)
            return a < b ? (a, b) : nil
        }
        held.sort { $0.start < $1.start }
        var merged: [(start: Int64, end: Int64)] = []
        for r in held {
            if let last = merged.last, r.start <= last.end {
                merged[merged.count - 1].end = max(last.end, r.end)
            } else {
                merged.append(r)
            }
        }
        guard merged.reduce(0, { $0 + $1.end - $1.start }) > before else { return segments }
        var result: [SegmentRecord] = []
        if let first = merged.first, first.start > 0 { result.append(SegmentRecord(start: 0, end: first.start, done: 0)) }
        for (i, r) in merged.enumerated() {
            let end = i + 1 < merged.count ? merged[i + 1].start : total
            result.append(SegmentRecord(start: r.start, end: end, done: r.end - r.start))
        }
        return result
    }
}
