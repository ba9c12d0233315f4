import CPickupShims
import Foundation
import NIOConcurrencyHelpers
import Pickup

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Commands to run when a download ends: `--on-complete` and `--on-error` of `pickup get` and
/// `pickup serve`, or the daemon's settings file (never its API: whoever holds the token must not
/// be able to make the daemon run a program).
public struct Hooks: Sendable, Equatable {
    /// The program run when a download completes (a path, or a name looked up in `PATH`).
    public var onComplete: String?
    /// The program run when a download fails.
    public var onError: String?
    /// Seconds a hook may run; then it gets SIGTERM, and SIGKILL two seconds later.
    public var timeout: Double

    public init(onComplete: String? = nil, onError: String? = nil, timeout: Double = 60) {
        self.onComplete = onComplete
        self.onError = onError
        self.timeout = timeout
    }

    public var isEmpty: Bool { onComplete == nil && onError == nil }
}

/// How a download ended, as a hook is told.
public struct HookEvent: Sendable, Equatable {
    /// The finished file (nil for a failure before it was named).
    public var path: String?
    /// The URL, its credentials shown as `***`.
    public var url: String
    /// The file's size in bytes, when known.
    public var size: Int64?
    /// Whether it completed.
    public var completed: Bool
    /// Why it failed.
    public var error: String?

    public init(path: String?, url: String, size: Int64?, completed: Bool, error: String? = nil) {
        self.path = path
        self.url = DownloadURL.redacted(url)
        self.size = size
        self.completed = completed
        self.error = error
    }

    /// The hook's environment: `PICKUP_PATH`, `PICKUP_URL`, `PICKUP_SIZE`, `PICKUP_OUTCOME`
    /// (`completed` or `failed`) and, for a failure, `PICKUP_ERROR`.
    public var environment: [String: String] {
        var env = ["PICKUP_PATH": path ?? "", "PICKUP_URL": url, "PICKUP_OUTCOME": completed ? "completed" : "failed"]
        if let size { env["PICKUP_SIZE"] = String(size) }
        if let error { env["PICKUP_ERROR"] = error }
        return env
    }
}

/// Runs hooks without a shell, one at a time per process, each within its timeout.
///
/// A hook runs in a process group of its own, with no descriptor of Pickup's but standard input
/// (/dev/null), standard output and standard error (both Pickup's standard error), and every
/// signal at its default action (`pickup_spawn_hook`). Its end is its `waitpid`; programs it leaves
/// running in the background are its own and hold nothing of Pickup's. At the timeout the whole
/// group gets SIGTERM, and SIGKILL two seconds later; every wait has a bound (the reaping after
/// SIGKILL too: a process that the kernel cannot end is reported and left). ``stop()`` (a signal to
/// Pickup) ends the running hook's group at once and drops the queued ones. A hook that cannot
/// start, exits non-zero or runs out of time is reported through `report` (one line) and changes
/// nothing about the download.
public final class HookRunner: Sendable {
    public let hooks: Hooks
    let report: @Sendable (String) -> Void
    private let queue = DispatchQueue(label: "pickup.hooks")
    private let group = DispatchGroup()
    private let state = NIOLockedValueBox(RunnerState())

    struct RunnerState {
        var stopped = false
        /// The process group of the hook running now.
        var running: pid_t?
    }

    /// How often a running hook is looked at (`waitpid` with `WNOHANG`).
    static let poll: useconds_t = 10_000
    /// After SIGTERM, the grace before SIGKILL; after SIGKILL, how long reaping may take.
    static let grace = 2.0
    static let reapBound = 5.0

    public init(hooks: Hooks, report: @escaping @Sendable (String) -> Void) {
        self.hooks = hooks
        self.report = report
    }

    /// Queues the hook for `event`, if one is set for its outcome.
    public func fire(_ event: HookEvent) {
        guard let command = event.completed ? hooks.onComplete : hooks.onError else { return }
        group.enter()
        queue.async {
            defer { self.group.leave() }
            guard !self.state.withLockedValue({ $0.stopped }) else { return }
            self.run(command, event)
        }
    }

    /// Returns once every queued hook has run.
    public func drain() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            group.notify(queue: .global()) { c.resume() }
        }
    }

    /// Stops the running hook's whole process group (SIGTERM, then SIGKILL after the grace) and
    /// drops the hooks not started yet: Pickup was told to stop.
    public func stop() {
        let pgid = state.withLockedValue { s -> pid_t? in
            s.stopped = true
            return s.running
        }
        if let pgid { kill(-pgid, SIGTERM) }
    }

    /// The program a command names: a path as given, else the first executable of that name in
    /// `PATH`; nil when it is not an executable file.
    public static func resolve(_ command: String) -> String? {
        if command.contains("/") { return FileManager.default.isExecutableFile(atPath: command) ? command : nil }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return path.split(separator: ":").map { "\($0)/\(command)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// Runs one hook to its end, on the runner's queue (never Swift's cooperative pool).
    private func run(_ command: String, _ event: HookEvent) {
        guard let program = Self.resolve(command) else {
            report("hook \(command): not found")
            return
        }
        let environment = ProcessInfo.processInfo.environment.merging(event.environment) { $1 }
        var pid: pid_t = 0
        let started = Self.withCStrings([program, event.path ?? ""]) { argv in
            Self.withCStrings(environment.map { "\($0.key)=\($0.value)" }) { envp in
                pickup_spawn_hook(program, argv, envp, &pid)
            }
        }
        guard started == 0 else {
            report("hook \(command) could not start: \(String(cString: strerror(started)))")
            return
        }
        // A stop that came while it was starting applies to it too.
        if state.withLockedValue({ s in s.running = pid; return s.stopped }) { kill(-pid, SIGTERM) }
        defer { state.withLockedValue { $0.running = nil } }
        let deadline = DispatchTime.now() + Seconds.clamped(hooks.timeout)
        var ended = wait(pid, until: deadline) { self.state.withLockedValue { $0.stopped } }
        var why: String? = nil
        if ended == nil {
            let stopping = state.withLockedValue { $0.stopped }
            kill(-pid, SIGTERM)
            ended = wait(pid, until: DispatchTime.now() + Self.grace)
            if ended == nil {
                kill(-pid, SIGKILL)
                ended = wait(pid, until: DispatchTime.now() + Self.reapBound)
            }
            why = stopping ? "was stopped: pickup is stopping" : "ran out of time (\(Self.seconds(hooks.timeout)) s) and was stopped"
        } else if state.withLockedValue({ $0.stopped }) {
            // Pickup is stopping: whatever the hook left in its group goes with it.
            kill(-pid, SIGTERM)
        }
        guard let status = ended else {
            report("hook \(command) did not end even after SIGKILL; left behind (pid \(pid))")
            return
        }
        if let why {
            report("hook \(command) \(why)" + (Self.signal(of: status).map { " (signal \($0))" } ?? ""))
        } else if let sig = Self.signal(of: status) {
            report("hook \(command) was killed by signal \(sig)")
        } else if let code = Self.exitCode(of: status), code != 0 {
            report("hook \(command) exited with status \(code)")
        }
    }

    /// Waits for `pid` to end, until `deadline` or until `stop` says so; its wait status, or nil.
    private func wait(_ pid: pid_t, until deadline: DispatchTime, stop: () -> Bool = { false }) -> Int32? {
        while true {
            var status: Int32 = 0
            let r = waitpid(pid, &status, WNOHANG)
            if r == pid { return status }
            if r == -1 && errno != EINTR { return 0 }  // not ours to wait for any more (reaped elsewhere)
            if DispatchTime.now() >= deadline || stop() { return nil }
            usleep(Self.poll)
        }
    }

    static func signal(of status: Int32) -> Int32? {
        let sig = status & 0x7f
        return sig != 0 && sig != 0x7f ? sig : nil
    }

    static func exitCode(of status: Int32) -> Int32? {
        status & 0x7f == 0 ? (status >> 8) & 0xff : nil
    }

    static func seconds(_ t: Double) -> String {
        let t = Seconds.clamped(t)
        return t == t.rounded() ? String(Int(t)) : String(format: "%.1f", t)
    }

    /// Runs `body` with a NULL-terminated array of C strings.
    static func withCStrings<T>(_ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> T) -> T {
        let pointers = strings.map { strdup($0) } + [nil]
        defer { for p in pointers { free(p) } }
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }
}
