import Foundation
import NIOConcurrencyHelpers
import Pickup
#if canImport(Subprocess)
import Subprocess
import SystemPackage
#endif

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
/// A hook is started through swift-subprocess: in a process group of its own, with no descriptor
/// of Pickup's but standard input (/dev/null), standard output and standard error (both Pickup's
/// standard error), and every signal at its default action. Its end is its own process's end;
/// programs it leaves running in the background are its own and hold nothing of Pickup's. At the
/// timeout the whole group gets SIGTERM, and SIGKILL two seconds later (the teardown sequence);
/// every wait has a bound (the reaping after SIGKILL too: a process that the kernel cannot end is
/// reported and left). ``stop()`` (a signal to Pickup) starts the running hook's teardown at once and
/// drops the queued ones. A hook that cannot start, exits non-zero or runs out of time is reported
/// through `report` (one line) and changes nothing about the download.
///
/// Spawning (which opens /dev/null) and reaping run on the runner's own thread
/// (``HookExecutor``), never on Swift's cooperative pool; the wait for a process's end is
/// swift-subprocess's (a pidfd watched by its own thread on Linux, kqueue on macOS).
public final class HookRunner: Sendable {
    public let hooks: Hooks
    let report: @Sendable (String) -> Void
    private let state = NIOLockedValueBox(RunnerState())

    struct RunnerState {
        var stopped = false
        /// The hook queued last: the next one starts when it has ended (one at a time, in order).
        var last: Task<Void, Never>?
        /// The hooks queued or running, by the order they were fired: what ``stop()`` cancels.
        var live: [Int: Task<Void, Never>] = [:]
        var fired = 0
    }

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
        state.withLockedValue { s in
            guard !s.stopped else { return }
            let previous = s.last, id = s.fired
            s.fired += 1
            let task = Task {
                await previous?.value
                defer { self.state.withLockedValue { _ = $0.live.removeValue(forKey: id) } }
                guard !Task.isCancelled else { return }
                await self.run(command, event)
            }
            s.last = task
            s.live[id] = task
        }
    }

    /// Returns once every queued hook has run (or was dropped by ``stop()``).
    public func drain() async {
        await state.withLockedValue { $0.last }?.value
    }

    /// Stops the running hook's whole process group (SIGTERM, then SIGKILL after the grace) and
    /// drops the hooks not started yet: Pickup was told to stop.
    public func stop() {
        let live = state.withLockedValue { s -> [Task<Void, Never>] in
            s.stopped = true
            return Array(s.live.values)
        }
        for task in live { task.cancel() }
    }

    /// The program a command names: a path as given, else the first executable of that name in
    /// `PATH`; nil when it is not an executable file.
    public static func resolve(_ command: String) -> String? {
        if command.contains("/") { return FileManager.default.isExecutableFile(atPath: command) ? command : nil }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return path.split(separator: ":").map { "\($0)/\(command)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// How a hook's process ended: its status, or why it never ran.
    enum Ended: Sendable {
        case exited(Int32)
        case signalled(Int32)
        case failed(String)
    }

    /// Runs one hook to its end (cancelled: Pickup is stopping).
    private func run(_ command: String, _ event: HookEvent) async {
        guard let program = Self.resolve(command) else {
            report("hook \(command): not found")
            return
        }
        let group = NIOLockedValueBox<pid_t?>(nil)
        let process = Task { await Self.spawn(program, event, group: group) }
        var ended = await Self.value(of: process, within: hooks.timeout, orUntilCancelled: true)
        var why: String? = nil
        if ended == nil {
            // Out of time, or Pickup is stopping: the teardown sequence (SIGTERM to the group,
            // SIGKILL after the grace), then a bounded wait for the reaping.
            let stopping = state.withLockedValue { $0.stopped }
            process.cancel()
            ended = await Self.value(of: process, within: Self.grace + Self.reapBound, orUntilCancelled: false)
            why = stopping ? "was stopped: pickup is stopping" : "ran out of time (\(Self.seconds(hooks.timeout)) s) and was stopped"
        } else if state.withLockedValue({ $0.stopped }), let pgid = group.withLockedValue({ $0 }) {
            // Pickup is stopping: whatever the hook left in its group goes with it.
            kill(-pgid, SIGTERM)
        }
        switch ended {
        case nil:
            let pid = group.withLockedValue { $0 }.map { " (pid \($0))" } ?? ""
            report("hook \(command) did not end even after SIGKILL; left behind\(pid)")
        case .failed(let message)?:
            report("hook \(command) could not be run (started or watched): \(message)")
        case .signalled(let sig)?:
            report("hook \(command) " + (why.map { "\($0) (signal \(sig))" } ?? "was killed by signal \(sig)"))
        case .exited(let code)?:
            if let why {
                report("hook \(command) \(why)")
            } else if code != 0 {
                report("hook \(command) exited with status \(code)")
            }
        }
    }

    /// Starts `program` for `event` and waits for its end; cancelled, its group is torn down.
    /// `group` learns its process group (its pid) once it runs.
    private static func spawn(_ program: String, _ event: HookEvent, group: NIOLockedValueBox<pid_t?>) async -> Ended {
        #if canImport(Subprocess)
        var options = PlatformOptions()
        options.processGroupID = 0
        options.teardownSequence = [.gracefulShutDown(toProcessGroup: true, allowedDurationToNextStep: .milliseconds(Int64(grace * 1000)))]
        var environment: [Environment.Key: String?] = [:]
        for (key, value) in event.environment { if let key = Environment.Key(rawValue: key) { environment[key] = value } }
        let run = { @Sendable [options, environment] () async -> Ended in
            do {
                let result = try await Subprocess.run(
                    .path(FilePath(program)), arguments: [event.path ?? ""], environment: .inherit.updating(environment),
                    platformOptions: options, input: .none, output: .currentStandardError, error: .currentStandardError
                ) { execution in
                    group.withLockedValue { $0 = execution.processIdentifier.value }
                }
                switch result.terminationStatus {
                case .exited(let code): return .exited(code)
                case .signaled(let sig): return .signalled(sig)
                }
            } catch {
                return .failed(String(describing: error))
            }
        }
        if #available(macOS 15, *) {
            return await withTaskExecutorPreference(HookExecutor.shared) { await run() }
        }
        return await run()
        #else
        return .failed("hooks are not available on this platform")
        #endif
    }

    /// `task`'s value, waiting at most `seconds` (and, `orUntilCancelled`, only while the calling
    /// task is not cancelled); nil when it had not ended by then (it goes on).
    static func value<T: Sendable>(of task: Task<T, Never>, within seconds: Double, orUntilCancelled: Bool) async -> T? {
        let waiting = NIOLockedValueBox<(CheckedContinuation<T?, Never>?, Task<Void, Never>?)>((nil, nil))
        let finish: @Sendable (T?) -> Void = { value in
            let (c, timer) = waiting.withLockedValue { w in
                defer { w = (nil, nil) }
                return w
            }
            timer?.cancel()
            c?.resume(returning: value)
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<T?, Never>) in
                waiting.withLockedValue { $0.0 = c }
                let timer = Task {
                    try? await Task.sleep(nanoseconds: Seconds.nanoseconds(seconds))
                    finish(nil)
                }
                // (Kept to be cancelled, unless the wait is over already.)
                let stillWaiting = waiting.withLockedValue { w -> Bool in
                    guard w.0 != nil else { return false }
                    w.1 = timer
                    return true
                }
                if !stillWaiting { timer.cancel() }
                Task { finish(await task.value) }
                if orUntilCancelled, Task.isCancelled { finish(nil) }
            }
        } onCancel: {
            if orUntilCancelled { finish(nil) }
        }
    }

    static func seconds(_ t: Double) -> String {
        let t = Seconds.clamped(t)
        return t == t.rounded() ? String(Int(t)) : String(format: "%.1f", t)
    }
}

/// The hooks' own thread, for swift-subprocess's synchronous steps (spawning opens /dev/null;
/// reaping calls `waitid`): a serial queue, off Swift's cooperative pool.
@available(macOS 15, *)
final class HookExecutor: TaskExecutor {
    static let shared = HookExecutor()
    private let queue = DispatchQueue(label: "pickup.hooks")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
