import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Group commit for directory fsyncs. Making a rename durable takes an fsync of its directory,
/// and a batch finishes many files in one directory at once: each caller needs *an* fsync of the
/// directory that started after its rename, not one of its own. A caller that finds one running
/// waits for the next, which the first waiter starts when the running one ends, for everyone who
/// arrived meanwhile: sixteen files finishing together cost two directory fsyncs, not sixteen.
///
/// Blocking: called on the blocking-I/O pool only (as every fsync is). Keyed by the directory's
/// device and inode, so that the handles of several downloads into one directory share it; a
/// barrier sync (Apple platforms' checkpoints) never stands in for a full one.
package final class DirectorySync: @unchecked Sendable {
    package struct Key: Hashable, Sendable {
        let device: UInt64
        let inode: UInt64
        let barrier: Bool
    }

    /// One directory's syncs: how many started and how many ended (in order: one runs at a time).
    private struct Lane {
        var started: UInt64 = 0
        var finished: UInt64 = 0
        var running = false
        var callers = 0
    }

    private let condition = NSCondition()
    private var lanes: [Key: Lane] = [:]
    private let perform: @Sendable (Int32, Bool) -> Void

    /// `perform`: the fsync itself (a test counts and orders them).
    package init(perform: @escaping @Sendable (Int32, Bool) -> Void) {
        self.perform = perform
    }

    /// The process's one coalescer.
    package static let shared = DirectorySync { fd, barrier in
        try? FS.fsync(FileDescriptor(rawValue: fd), barrier: barrier)
    }

    /// The key of the directory open at `fd`, or nil when it cannot be read (then the caller
    /// syncs on its own).
    package static func key(of fd: Int32, barrier: Bool) -> Key? {
        var info = stat()
        guard fstat(fd, &info) == 0 else { return nil }
        return Key(device: UInt64(truncatingIfNeeded: info.st_dev), inode: UInt64(truncatingIfNeeded: info.st_ino), barrier: barrier)
    }

    /// Callers inside ``sync(_:key:)`` for `key` now (for tests).
    package func callers(_ key: Key) -> Int {
        condition.lock()
        defer { condition.unlock() }
        return lanes[key]?.callers ?? 0
    }

    /// Returns once an fsync of the directory that started after this call has ended.
    package func sync(_ fd: Int32, key: Key) {
        condition.lock()
        defer { condition.unlock() }
        var lane = lanes[key, default: Lane()]
        // The next sync to start: the one running (if any) may have begun before our rename.
        let needed = lane.started + 1
        lane.callers += 1
        lanes[key] = lane
        while lanes[key]!.finished < needed {
            if lanes[key]!.running {
                condition.wait()
                continue
            }
            lanes[key]!.running = true
            lanes[key]!.started += 1
            let mine = lanes[key]!.started
            condition.unlock()
            perform(fd, key.barrier)
            condition.lock()
            lanes[key]!.finished = mine
            lanes[key]!.running = false
            condition.broadcast()
        }
        lanes[key]!.callers -= 1
        if lanes[key]!.callers == 0 { lanes[key] = nil }
    }
}
