import Dispatch
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Keeps one download from putting a manager's process in a crash loop: a download that was
/// running each of the last two times the process died (a trap, SIGKILL, the OOM killer: nothing
/// that can be caught) is restored paused, with a failure that says so, and the rest of the queue
/// runs.
///
/// The process cannot say it is dying, so it says what it is about to do: `running` in the state
/// directory is a log of lines appended (plain `write`s, which survive the process, not a power
/// cut: a reboot is not a crash loop) before each download runs (`run ID`), when it ends
/// (`end ID`), and at a clean shutdown (`clean`). At the next start, a log without `clean` is a
/// death, and what ran and did not end was running then. The log is then rewritten to the latest
/// death (`death ID ...`) and a new `start`. The appends run in order on a serial queue of the
/// guard's own (never Swift's cooperative pool); `running` returns once its line is written.
final class CrashGuard: @unchecked Sendable {
    /// What the log said at a start: the downloads to hold back, and the death to carry on.
    struct Verdict: Equatable {
        var suspects: Set<Int64>
        var lastDeath: Set<Int64>?
    }

    /// The failure a held-back download shows.
    static let reason = "paused: the process running the downloads ended abruptly twice while this one ran "
        + "(a crash loop?); resume it to try again"

    /// The log is read up to this many bytes (a process runs at most this many downloads' lines
    /// before a restart rewrites it; past it, the guard stops writing and decides nothing).
    static let maxBytes = 4 << 20

    private let fd: Int32
    /// Bytes written so far; only on `queue`.
    private var size: Int
    private let queue = DispatchQueue(label: "pickup.crash-guard")

    private init(fd: Int32, size: Int) {
        self.fd = fd
        self.size = size
    }

    deinit { close(fd) }

    /// Reads the log a previous process left, decides, and starts a new one. Nil (and nothing held
    /// back) when the file cannot be used: the guard never stops a manager from starting.
    static func start(in directory: FilePath) -> (CrashGuard?, Set<Int64>) {
        let path = directory.appending("running").string
        var old = ""
        let rfd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        if rfd >= 0 {
            let limit = maxBytes + 64
            var bytes = [UInt8](repeating: 0, count: limit)
            var n = 0
            while n < limit {
                let r = bytes.withUnsafeMutableBytes { read(rfd, $0.baseAddress! + n, limit - n) }
                if r <= 0 { break }
                n += r
            }
            close(rfd)
            old = String(decoding: bytes[..<n], as: UTF8.self)
        }
        let verdict = decide(old)
        var text = verdict.lastDeath.map { "death " + $0.sorted().map(String.init).joined(separator: " ") + "\n" } ?? ""
        text += "start\n"
        // Replaced whole (a new file renamed over the old), so a half-written log is never read.
        let tmp = path + ".tmp"
        unlink(tmp)
        let fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { return (nil, verdict.suspects) }
        let guardFile = CrashGuard(fd: fd, size: 0)
        guardFile.append(text)
        guard rename(tmp, path) == 0 else { return (nil, verdict.suspects) }
        return (guardFile, verdict.suspects)
    }

    /// The pure decision on a log's text: the previous process died if it did not write `clean`
    /// after its `start`; what it ran and did not end was running then. Held back: what was
    /// running at that death and at the one before it.
    static func decide(_ text: String) -> Verdict {
        var earlier: Set<Int64>? = nil
        var runs: Set<Int64> = []
        var started = false, clean = false
        for line in text.split(separator: "\n") {
            let words = line.split(separator: " ")
            guard let word = words.first else { continue }
            let ids = words.dropFirst().prefix(10_000).compactMap { Int64($0) }
            switch word {
            case "death": earlier = Set(ids)
            case "start": started = true; clean = false; runs = []
            case "run": runs.formUnion(ids)
            case "end": runs.subtract(ids)
            case "clean": clean = true
            case "full": return Verdict(suspects: [], lastDeath: nil)  // what ended was not written: decide nothing
            default: break
            }
        }
        guard started, !clean else { return Verdict(suspects: [], lastDeath: earlier) }
        return Verdict(suspects: earlier.map { $0.intersection(runs) } ?? [], lastDeath: runs)
    }

    /// Download `id` is about to run: returns once that is written, before it runs.
    func running(_ id: Int64) async {
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            queue.async {
                self.append("run \(id)\n")
                done.resume()
            }
        }
    }
    /// Download `id` stopped running (however it ended), once that is recorded.
    func ended(_ id: Int64) { queue.async { self.append("end \(id)\n") } }
    /// The process is shutting down cleanly: nothing it ran counts against a download.
    func clean() async {
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            queue.async {
                self.append("clean\n", always: true)
                done.resume()
            }
        }
    }

    /// A log that cannot take a line whole (past its bound, a full disk) ends with `full` and
    /// takes nothing more: a reader then decides nothing, rather than blame what it cannot see
    /// ended. (`clean` and `full` are written even past the bound, which the reader allows for.)
    private func append(_ line: String, always: Bool = false) {
        guard size >= 0 else { return }  // full
        guard always || size + line.utf8.count <= Self.maxBytes, writeWhole(line) else {
            _ = writeWhole("\nfull\n")
            size = -1
            return
        }
        size += line.utf8.count
    }

    private func writeWhole(_ line: String) -> Bool {
        var line = line
        return line.withUTF8 { b in write(fd, b.baseAddress, b.count) == b.count }
    }
}
