import Foundation
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

/// Runs hooks without a shell, one at a time per process, each within its timeout (then the hook's
/// process gets SIGTERM, and SIGKILL two seconds later; programs it started itself are its own to
/// stop). A hook that cannot start, exits non-zero or runs out of time is reported through `report`
/// (one line) and changes nothing about the download.
public final class HookRunner: Sendable {
    public let hooks: Hooks
    let report: @Sendable (String) -> Void
    private let queue = DispatchQueue(label: "pickup.hooks")
    private let group = DispatchGroup()

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
            self.run(command, event)
        }
    }

    /// Returns once every queued hook has run.
    public func drain() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            group.notify(queue: .global()) { c.resume() }
        }
    }

    /// The program a command names: a path as given, else the first executable of that name in
    /// `PATH`; nil when it is not an executable file.
    public static func resolve(_ command: String) -> String? {
        if command.contains("/") { return FileManager.default.isExecutableFile(atPath: command) ? command : nil }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return path.split(separator: ":").map { "\($0)/\(command)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    private func run(_ command: String, _ event: HookEvent) {
        #if os(macOS) || os(Linux)
        guard let program = Self.resolve(command) else {
            report("hook \(command): not found")
            return
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = [event.path ?? ""]
        process.environment = ProcessInfo.processInfo.environment.merging(event.environment) { $1 }
        // The hook's output goes to standard error: standard output may be JSON for a script.
        process.standardOutput = FileHandle.standardError
        process.standardInput = FileHandle.nullDevice
        let done = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in done.signal() }
        do {
            try process.run()
        } catch {
            report("hook \(command) could not start: \(error.localizedDescription)")
            return
        }
        if done.wait(timeout: .now() + hooks.timeout) == .timedOut {
            process.terminate()
            if done.wait(timeout: .now() + 2) == .timedOut {
                kill(process.processIdentifier, SIGKILL)
                done.wait()
            }
            report("hook \(command) ran out of time (\(Int(hooks.timeout)) s) and was stopped")
            return
        }
        if process.terminationReason == .uncaughtSignal {
            report("hook \(command) was killed by signal \(process.terminationStatus)")
        } else if process.terminationStatus != 0 {
            report("hook \(command) exited with status \(process.terminationStatus)")
        }
        #else
        report("hooks are not supported on this platform")
        #endif
    }
}
