#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif
import NIOConcurrencyHelpers

/// Decides whether a download's extra connections earn their keep: a value-type state machine fed
/// one sample per progress tick, tested without sockets.
///
/// Several connections help when each is capped (by the server or the path); they cost CPU (more
/// reads, more wakeups, writers contending for one file) and help nothing when this process is
/// what limits the speed (a fast LAN, loopback, a slow CPU). So while the download runs on several
/// connections, the tuner watches the process's CPU time: when it uses at least `busyShare` of the
/// threads its connections can run on, in `busyWindows` windows in a row (a server that lets every
/// new connection burst, as nginx's `limit_rate` does, makes one busy window at the start of a
/// throttled download), it asks to *shed* to one connection: a trial, in which the other
/// connections are held (they read nothing, their connections and responses stay open). It then
/// compares the speed on one connection with the speed before: if one connection is clearly
/// slower (below `keepShare` of it, over `verifyWindow`), the connections were earning their keep
/// after all, and it asks to *restore* them (they read on where they were: no connection is
/// opened again); else it asks to *keep* the shed (the held ranges end where they are, and the one
/// connection takes the rest). It decides once per run either way, so it never oscillates.
struct ConnectionTuner: Sendable, Equatable {
    enum Action: Sendable, Equatable {
        /// Try one connection: hold the others.
        case shed
        /// The trial is over, one connection was slower: the held connections go on.
        case restore
        /// The trial stands: go on with one connection (the held ranges end where they are).
        case keepShed
    }

    /// One reading: monotonic seconds, process CPU seconds, body bytes so far (during a trial, the
    /// one connection's since it began), connections with a range (during a trial, 1).
    struct Sample: Sendable, Equatable {
        var time: Double
        var cpu: Double
        var bytes: Int64
        var connections: Int
    }

    enum Phase: Sendable, Equatable {
        /// The connections are opening (connects, TLS handshakes: CPU that says nothing of the
        /// transfer): the first window is skipped, and every one after it until all the
        /// connections of the first sample bring bytes (on a loaded machine they can take a
        /// while, and a speed measured over their opening would make one connection look fast).
        case warmup
        /// Several connections run; looking for a CPU-bound window.
        case watching
        /// Shed: `rate` bytes/s was the speed before. The others are held (their connections
        /// stay open for a restore); `since` starts the window that decides, once one connection runs.
        case shed(rate: Double, since: Sample?)
        /// Decided for this run.
        case settled
    }

    /// Share of the usable threads the process must keep busy for the download to count as CPU-bound.
    var busyShare = 0.5
    /// Busy windows in a row that make the download count as CPU-bound.
    var busyWindows = 2
    /// Share of the earlier speed one connection must keep for the shedding to stay (connections
    /// that were each capped lose far more: one of N keeps about 1/N).
    var keepShare = 0.6
    /// Seconds of one-connection transfer that decide whether shedding stays.
    var verifyWindow = 0.2
    /// A trial whose one connection brings less than this share of `keepShare` of the speed
    /// before over two windows ends at once (connections each capped far below the link: one
    /// of 16 at 20 MiB/s brings a sixteenth), without waiting the whole `verifyWindow`.
    var clearlySlower = 0.33
    /// Threads the transport runs connections on.
    let threads: Int
    /// Windows shorter than this tell nothing. At 25 ms (a monitor step) a loopback download sheds
    /// about 80 ms after its connections open; 50 ms windows took 160 ms, at 16 connections' cost.
    let minWindow = 0.025
    /// Seconds between samples while deciding.
    static let step = 0.025
    private(set) var phase = Phase.warmup
    private var last: Sample?
    /// Where watching began: the speed before shedding is measured from here, over every window
    /// watched rather than the last one alone.
    private var watchStart: Sample?
    /// Busy windows in a row so far.
    private var busyInARow = 0
    /// The connections of the first sample: the warmup lasts until as many bring bytes.
    private var planned = 0
    /// The connections that ran when it shed (nil: it has not).
    private(set) var shedFrom: Int?

    init(threads: Int) {
        self.threads = max(1, threads)
    }

    /// Takes one sample; returns what to do, if anything.
    mutating func add(_ s: Sample) -> Action? {
        guard let previous = last else {
            // Only a window in which several connections ran from its start can say anything.
            if s.connections > 1 {
                last = s
                planned = s.connections
            }
            return nil
        }
        let window = s.time - previous.time
        guard window >= minWindow else { return nil }
        last = s
        let rate = Double(s.bytes - previous.bytes) / window
        switch phase {
        case .warmup:
            guard s.connections >= planned else { return nil }
            phase = .watching
            watchStart = s
            return nil
        case .watching:
            guard s.connections > 1, previous.connections > 1 else { return nil }
            let load = (s.cpu - previous.cpu) / window
            guard load >= busyShare * Double(min(threads, s.connections)), rate > 0 else {
                busyInARow = 0
                return nil
            }
            busyInARow += 1
            guard busyInARow >= busyWindows else { return nil }
            let from = watchStart ?? previous
            phase = .shed(rate: Double(s.bytes - from.bytes) / (s.time - from.time), since: nil)
            shedFrom = s.connections
            return .shed
        case .shed(let before, nil):
            // The window that decides starts with the trial's first sample (the others held).
            guard s.connections <= 1 else { return nil }
            phase = .shed(rate: before, since: s)
            return nil
        case .shed(let before, let since?):
            let elapsed = s.time - since.time
            let after = Double(s.bytes - since.bytes) / elapsed
            if elapsed >= 2 * minWindow, after < clearlySlower * keepShare * before {
                phase = .settled
                return .restore
            }
            guard elapsed >= verifyWindow else { return nil }
            phase = .settled
            return after < keepShare * before ? .restore : .keepShed
        case .settled:
            return nil
        }
    }
}

/// CPU time of this process (user + system), in seconds.
enum ProcessCPU {
    static func seconds() -> Double {
        var usage = rusage()
        #if canImport(Glibc)
        let who = __rusage_who_t(RUSAGE_SELF.rawValue)
        #else
        let who = RUSAGE_SELF
        #endif
        guard getrusage(who, &usage) == 0 else { return 0 }
        func s(_ t: timeval) -> Double { Double(t.tv_sec) + Double(t.tv_usec) / 1e6 }
        return s(usage.ru_utime) + s(usage.ru_stime)
    }
}

/// A gate that opens once: tasks wait at it until it opens or they are cancelled.
final class Gate: Sendable {
    private struct State {
        var open = false
        var next = 0
        var waiters: [Int: CheckedContinuation<Void, any Error>] = [:]
    }
    private let state = NIOLockedValueBox(State())

    /// Returns when the gate is open; throws `CancellationError` if the task is cancelled first.
    func wait() async throws {
        let id = state.withLockedValue { s -> Int in
            s.next += 1
            return s.next
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                let resume: Result<Void, any Error>? = state.withLockedValue { s in
                    if s.open { return .success(()) }
                    if Task.isCancelled { return .failure(CancellationError()) }
                    s.waiters[id] = c
                    return nil
                }
                if let resume { c.resume(with: resume) }
            }
        } onCancel: {
            state.withLockedValue { $0.waiters.removeValue(forKey: id) }?.resume(throwing: CancellationError())
        }
    }

    /// Opens the gate: every waiter goes on, and later waits return at once.
    func open() {
        let waiters = state.withLockedValue { s in
            s.open = true
            defer { s.waiters = [:] }
            return Array(s.waiters.values)
        }
        for w in waiters { w.resume() }
    }
}
