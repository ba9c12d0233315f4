import Foundation
import NIOConcurrencyHelpers
#if canImport(Subprocess)
import Subprocess
import SystemPackage
#endif

/// A program a test runs: every child process of the tests (`pickup`, servers, proxies, Python,
/// openssl, mount) starts here, through swift-subprocess.
///
/// - Spawning happens on swift-subprocess's own thread and the wait for the end is its own (a pidfd
///   watched by its thread on Linux): nothing here blocks a thread of Swift's cooperative pool.
/// - The child starts with every signal unblocked and at its default action (swift-subprocess resets
///   both in the child before `exec`, by `posix_spawnattr_setsigmask`/`setsigdefault` or, on its
///   fork path, `sigprocmask` and `signal(SIG_DFL)`): the test runner's threads block nearly every
///   signal, and a server started with them blocked never reaps its sessions (vsftpd then refuses
///   all after `max_clients`) nor honours SIGTERM. A shell starts programs so, as users do.
/// - It runs in a process group of its own: ``stop()`` and the teardown take whatever it started too.
/// - It is killed (SIGKILL) after `maxSeconds`: a run that hangs fails its test instead of hanging
///   the suite.
/// - Teardown: a waiter (``wait()``) that is cancelled, or the last reference dropped (a test that
///   threw), ends it with swift-subprocess's teardown sequence: SIGTERM to its group, SIGKILL two
///   seconds later.
public final class Child: Sendable {
    /// How a child ended.
    public enum Status: Sendable, Equatable, CustomStringConvertible {
        case exited(Int32)
        case signalled(Int32)
        /// It ran, but its end could not be watched or reaped (swift-subprocess's error).
        case unknown(String)

        /// Whether it exited (with any code), not killed by a signal.
        public var exited: Bool {
            if case .exited = self { true } else { false }
        }

        /// The status as a shell reports it: the exit code, or 128 + the signal.
        public var code: Int32 {
            switch self {
            case .exited(let code): code
            case .signalled(let signal): 128 + signal
            case .unknown: -1
            }
        }

        public var description: String {
            switch self {
            case .exited(let code): "exited \(code)"
            case .signalled(let signal): "killed by signal \(signal)"
            case .unknown(let why): "ended unseen: \(why)"
            }
        }
    }

    /// Standard input.
    public enum Input: Sendable {
        /// /dev/null.
        case null
        /// These bytes, from a file (no pipe to fill before the child reads).
        case bytes([UInt8])
        /// A file read from its start.
        case file(String)
    }

    /// Standard output or error.
    public enum Output: Sendable {
        /// /dev/null.
        case null
        /// Collected, in ``Outcome``.
        case captured
        /// Appended to an existing file (processes that run at once do not write over each other's lines).
        case file(String)
        /// A descriptor the caller keeps (and closes).
        case descriptor(Int32)
        /// Standard error only: where standard output goes.
        case sameAsOutput
    }

    /// What a finished child left: its status, and its standard output and error when captured.
    public struct Outcome: Sendable {
        public var status: Status
        public var output: [UInt8]
        public var errors: [UInt8]
        public var text: String { String(decoding: output, as: UTF8.self) }
        public var errorText: String { String(decoding: errors, as: UTF8.self) }
    }

    /// Its process id (and process group's).
    public let pid: pid_t
    private let run: Task<Outcome, Never>
    private let ended: NIOLockedValueBox<Outcome?>

    private init(pid: pid_t, run: Task<Outcome, Never>, ended: NIOLockedValueBox<Outcome?>) {
        self.pid = pid
        self.run = run
        self.ended = ended
    }

    /// Released while it runs (a test that threw): the teardown sequence.
    deinit { run.cancel() }

    /// The longest a child may run unless told otherwise.
    public static let maxRunSeconds = 600.0

    /// Starts `executable` (a path) with `arguments`; returns once it runs. `environment` nil:
    /// this process's. Throws when it cannot be started.
    public static func start(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                             workingDirectory: String? = nil, input: Input = .null, output: Output = .null, errors: Output = .null,
                             maxSeconds: Double = maxRunSeconds) async throws -> Child {
        #if canImport(Subprocess)
        let ended = NIOLockedValueBox<Outcome?>(nil)
        // The spawn's result, for whichever comes second: the waiter, or the spawn (first wins).
        let started = NIOLockedValueBox<(waiter: CheckedContinuation<pid_t, any Error>?, result: Result<pid_t, any Error>?)>((nil, nil))
        let resume: @Sendable (Result<pid_t, any Error>) -> Void = { result in
            started.withLockedValue { s -> CheckedContinuation<pid_t, any Error>? in
                guard s.result == nil else { return nil }
                s.result = result
                defer { s.waiter = nil }
                return s.waiter
            }?.resume(with: result)
        }
        var opened: [FileDescriptor] = []
        func open(_ path: String, _ mode: FileDescriptor.AccessMode, append: Bool = false) throws -> FileDescriptor {
            let fd = try FileDescriptor.open(FilePath(path), mode, options: append ? [.append, .closeOnExec] : [.closeOnExec])
            opened.append(fd)
            return fd
        }
        // Descriptors opened here are the child's only: closed once it is spawned (or failed to be).
        let stdin: FileDescriptor
        switch input {
        case .null: stdin = try open("/dev/null", .readOnly)
        case .file(let path): stdin = try open(path, .readOnly)
        case .bytes(let bytes):
            let path = NSTemporaryDirectory() + "pickup-stdin-" + UUID().uuidString
            guard FileManager.default.createFile(atPath: path, contents: Data(bytes)) else { throw Failure("cannot write \(path)") }
            defer { unlink(path) }
            stdin = try open(path, .readOnly)
        }
        func sink(_ output: Output) throws -> Sink {
            switch output {
            case .null, .sameAsOutput: .descriptor(try open("/dev/null", .writeOnly), close: true)
            case .captured: .captured
            case .file(let path): .descriptor(try open(path, .writeOnly, append: true), close: true)
            case .descriptor(let fd): .descriptor(FileDescriptor(rawValue: fd), close: false)
            }
        }
        let out: Sink, err: Sink
        do {
            out = try sink(output)
            err = errors == .sameAsOutput ? .sameAsOutput : try sink(errors)
        } catch {
            for fd in opened { try? fd.close() }
            throw error
        }
        var options = PlatformOptions()
        options.processGroupID = 0
        options.teardownSequence = [.gracefulShutDown(toProcessGroup: true, allowedDurationToNextStep: .seconds(2))]
        var env: [Environment.Key: String] = [:]
        if let environment {
            for (key, value) in environment { if let key = Environment.Key(rawValue: key) { env[key] = value } }
        }
        let configuration = Configuration(
            executable: .path(FilePath(executable)), arguments: Arguments(arguments), environment: environment == nil ? .inherit : .custom(env),
            workingDirectory: workingDirectory.map { FilePath($0) }, platformOptions: options)
        let onStart: @Sendable (pid_t) -> Void = { pid in resume(.success(pid)) }
        let bound = NIOLockedValueBox<Task<Void, Never>?>(nil)
        let run = Task { () -> Outcome in
            let outcome: Outcome
            do {
                outcome = try await launch(configuration, stdin: stdin, out: out, err: err, onStart: onStart)
            } catch {
                resume(.failure(error))
                outcome = Outcome(status: .unknown(String(describing: error)), output: [], errors: [])
            }
            ended.withLockedValue { $0 = outcome }
            resume(.failure(Failure("ended before it was started")))  // (No-op once started.)
            bound.withLockedValue { $0 }?.cancel()
            return outcome
        }
        let pid: pid_t
        do {
            pid = try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { c in
                    let result = started.withLockedValue { s -> Result<pid_t, any Error>? in
                        if s.result == nil { s.waiter = c }
                        return s.result
                    }
                    if let result { c.resume(with: result) }
                }
            } onCancel: { run.cancel() }
        } catch {
            run.cancel()
            throw error
        }
        let child = Child(pid: pid, run: run, ended: ended)
        // The bound: SIGKILL to its group after `maxSeconds` (a sleeping task holds no thread).
        let timer = Task { [weak child] in
            guard (try? await Task.sleep(nanoseconds: UInt64(maxSeconds * 1e9))) != nil else { return }
            child?.kill()
        }
        bound.withLockedValue { $0 = timer }
        if !child.isRunning { timer.cancel() }
        return child
        #else
        throw Failure("child processes are not available on this platform")
        #endif
    }

    /// Starts it and waits for its end (cancelled: the teardown sequence).
    public static func run(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                           workingDirectory: String? = nil, input: Input = .null, output: Output = .captured, errors: Output = .captured,
                           maxSeconds: Double = maxRunSeconds) async throws -> Outcome {
        let child = try await start(executable, arguments, environment: environment, workingDirectory: workingDirectory,
                                    input: input, output: output, errors: errors, maxSeconds: maxSeconds)
        return await child.finish()
    }

    /// Whether it has not ended yet (or has not been reaped).
    public var isRunning: Bool { ended.withLockedValue { $0 } == nil }

    /// Its status once ended; nil while it runs.
    public var status: Status? { ended.withLockedValue { $0?.status } }

    /// Waits for its end; the calling task cancelled, tears it down first.
    public func finish() async -> Outcome {
        await withTaskCancellationHandler { await run.value } onCancel: { run.cancel() }
    }

    /// Waits for its end and returns its status.
    @discardableResult
    public func wait() async -> Status { await finish().status }

    /// Sends `signal` to it (to its whole process group with `group`), unless it has ended.
    public func signal(_ signal: Int32, group: Bool = false) {
        guard isRunning else { return }
        send(signal, to: group ? -pid : pid)
    }

    /// SIGKILLs it and its process group (unless it has ended) and waits for its end.
    @discardableResult
    public func stop() async -> Status {
        signal(SIGKILL, group: true)
        return await wait()
    }

    /// SIGKILLs it and its process group unless it has ended, without waiting (a `defer`, a
    /// `deinit`): swift-subprocess reaps it.
    public func kill() { signal(SIGKILL, group: true) }

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    #if canImport(Subprocess)
    enum Sink: Sendable {
        case descriptor(FileDescriptor, close: Bool)
        case captured
        case sameAsOutput
    }

    /// No limit on collected output: swift-subprocess reserves a finite limit up front (a child's
    /// output is bounded by its run's time bound instead).
    static let captureLimit = Int.max

    /// Runs the configuration to its end with these standard descriptors: swift-subprocess's
    /// output types are generic, so each combination is spelled out.
    private static func launch(_ configuration: Configuration, stdin: FileDescriptor, out: Sink, err: Sink,
                               onStart: @escaping @Sendable (pid_t) -> Void) async throws -> Outcome {
        let input = FileDescriptorInput.fileDescriptor(stdin, closeAfterSpawningProcess: true)
        switch (out, err) {
        case (.descriptor(let o, let co), .descriptor(let e, let ce)):
            return try await go(configuration, input, .fileDescriptor(o, closeAfterSpawningProcess: co), .fileDescriptor(e, closeAfterSpawningProcess: ce), onStart)
        case (.descriptor(let o, let co), .captured):
            return try await go(configuration, input, .fileDescriptor(o, closeAfterSpawningProcess: co), .bytes(limit: captureLimit), onStart)
        case (.descriptor(let o, let co), .sameAsOutput):
            return try await go(configuration, input, .fileDescriptor(o, closeAfterSpawningProcess: co), .combinedWithOutput, onStart)
        case (.captured, .descriptor(let e, let ce)):
            return try await go(configuration, input, .bytes(limit: captureLimit), .fileDescriptor(e, closeAfterSpawningProcess: ce), onStart)
        case (.captured, .captured):
            return try await go(configuration, input, .bytes(limit: captureLimit), .bytes(limit: captureLimit), onStart)
        case (.captured, .sameAsOutput):
            return try await go(configuration, input, .bytes(limit: captureLimit), .combinedWithOutput, onStart)
        case (.sameAsOutput, _):
            throw Failure("standard output cannot be standard error")
        }
    }

    private static func go<O: OutputProtocol, E: ErrorOutputProtocol>(
        _ configuration: Configuration, _ input: FileDescriptorInput, _ output: O, _ error: E, _ onStart: @escaping @Sendable (pid_t) -> Void
    ) async throws -> Outcome {
        let result = try await Subprocess.run(configuration, input: input, output: output, error: error) { execution in
            onStart(execution.processIdentifier.value)
        }
        let status: Status = switch result.terminationStatus {
        case .exited(let code): .exited(code)
        case .signaled(let signal): .signalled(signal)
        }
        return Outcome(status: status, output: (result.standardOutput as? [UInt8]) ?? [], errors: (result.standardError as? [UInt8]) ?? [])
    }
    #endif
}

extension Child.Output: Equatable {}

/// `kill(2)` (the name ``Child/kill()`` takes inside the class).
private func send(_ signal: Int32, to pid: pid_t) { kill(pid, signal) }

/// As ``eventually(seconds:every:_:)``, for a moment to act on at once: `condition` is polled on a
/// thread of its own (blocking there, never on Swift's cooperative pool, nor waiting for a thread of
/// Dispatch's global queue, which has two here), and `action` (told whether it held) runs on that
/// thread the moment the wait ends, not when a busy pool next runs the caller (a signal to a
/// process: on two loaded cores the pool can be busy for long enough that the moment has passed).
public func eventually(seconds: Double = 60, every: Double = 0.01, _ condition: @escaping @Sendable () -> Bool,
                       then action: @escaping @Sendable (_ held: Bool) -> Void) async -> Bool {
    await withCheckedContinuation { c in
        Thread {
            let deadline = Date().addingTimeInterval(seconds)
            var held = condition()
            while !held, Date() < deadline {
                usleep(UInt32(every * 1e6))
                held = condition()
            }
            action(held)
            c.resume(returning: held)
        }.start()
    }
}

/// Waits (bounded) until `condition` holds, polling every `every` seconds, without holding a thread
/// of Swift's cooperative pool (two here: a test that blocks one starves every in-process daemon
/// and manager of the suite); returns whether it did. The one poll of the tests.
public func eventually(seconds: Double = 60, every: Double = 0.01, _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try await condition() { return true }
        try? await Task.sleep(nanoseconds: UInt64(every * 1e9))
    }
    return try await condition()
}
