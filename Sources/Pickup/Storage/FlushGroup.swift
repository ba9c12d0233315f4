import CPickupShims
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Files that finish close together share their flushes (a group commit): the first caller makes
/// every file waiting at that moment durable at once, the others wait for it, and those that
/// arrive meanwhile form the next group.
///
/// On Linux a group is one `syncfs` per file system in it: one journal commit instead of one per
/// file, and the writeback runs in the kernel's flusher threads. Elsewhere (or where `syncfs`
/// fails) each file of the group is fsynced (`F_FULLFSYNC` on Apple platforms). Called on the
/// blocking-I/O pool only: it blocks.
final class FlushGroup: @unchecked Sendable {
    static let shared = FlushGroup()
    static let mode = ProcessInfo.processInfo.environment["PICKUP_FLUSH"] ?? "syncfs"

    private let condition = NSCondition()
    // Guarded by `condition`.
    private var waiting: [(ticket: Int, fd: Int32)] = []
    private var issued = 0
    private var completed = 0
    private var flushing = false
    private var failures: [Int: Errno] = [:]

    /// Returns once everything written to `fd` before the call is durable.
    func sync(_ fd: FileDescriptor) throws(Errno) {
        condition.lock()
        issued += 1
        let ticket = issued
        waiting.append((ticket, fd.rawValue))
        while completed < ticket {
            if flushing {
                condition.wait()
                continue
            }
            flushing = true
            let group = waiting
            waiting = []
            condition.unlock()
            let failed = Self.flush(group)
            condition.lock()
            for (t, e) in failed { failures[t] = e }
            completed = group.last?.ticket ?? completed
            flushing = false
            condition.broadcast()
        }
        let failure = failures.removeValue(forKey: ticket)
        condition.unlock()
        if let failure { throw failure }
    }

    /// Makes the group's files durable; returns the tickets that failed.
    private static func flush(_ group: [(ticket: Int, fd: Int32)]) -> [(Int, Errno)] {
        var failed: [(Int, Errno)] = []
        #if os(Linux)
        if mode == "fsync" {
            for m in group {
                do { try FS.fsync(FileDescriptor(rawValue: m.fd)) } catch { failed.append((m.ticket, error)) }
            }
            return failed
        }
        // One syncfs per file system (by device); a file system that refuses it falls back to fsync.
        var byDevice: [UInt64: [(ticket: Int, fd: Int32)]] = [:]
        for entry in group {
            var st = stat()
            let device = fstat(entry.fd, &st) == 0 ? UInt64(st.st_dev) : UInt64.max
            byDevice[device, default: []].append(entry)
        }
        for (_, members) in byDevice {
            if pickup_syncfs(members[0].fd) == 0 { continue }
            for m in members {
                do { try FS.fsync(FileDescriptor(rawValue: m.fd)) } catch { failed.append((m.ticket, error)) }
            }
        }
        #else
        for m in group {
            do { try FS.fsync(FileDescriptor(rawValue: m.fd)) } catch { failed.append((m.ticket, error)) }
        }
        #endif
        return failed
    }
}
