/// One connection's attempts at its range, as a value: after each failure, what to do next (back
/// off and retry, let the sources decide, leave the range to the others, give up), and the
/// bounds on redirects, unresolvable names and retries of the URL the user gave. No I/O and no
/// lock: `FileDownload.fetchRange` feeds it what happened, with the run's facts at that moment,
/// and does what it answers.
struct Attempt: Sendable, Equatable {
    /// The bounds it keeps.
    struct Limits: Sendable, Equatable {
        var retry: RetryPolicy
        var maxRedirects: Int
        /// A connection's own failures in a row after which it leaves its range to the others.
        var retireAfter = 3
    }

    /// What the run says at a decision.
    struct Facts: Sendable, Equatable {
        /// Bytes held now (more than at the last failure is progress, on any connection).
        var held: Int64
        /// Other connections are fetching: this one may leave its range to them.
        var othersFetching: Bool
        /// The file has several sources (mirrors).
        var several = false
        /// Bytes held from an earlier run are confirmed by a source (until then the source that
        /// can confirm them is retried in place).
        var heldConfirmed = true
    }

    /// A failure to count.
    struct Failure: Sendable, Equatable {
        var message: String
        /// The server (or FTP server) takes no more connections now: 503, 429, 421.
        var busy = false
        /// Seconds the server asked to wait (Retry-After).
        var retryAfter: Int64?
    }

    /// What to do next.
    enum Action: Sendable, Equatable {
        /// Wait this long, saying so, then try again.
        case backOff(seconds: Double, notice: String)
        /// Several sources: let them decide (retire one that asks too long a wait, mark this one
        /// busy or failing), then ``afterSources(_:connection:facts:jitter:)`` if they say retry here.
        case askSources(Failure, tooLong: Bool)
        /// Leave the range to the other connections, saying this.
        case leave(notice: String)
        /// The download fails.
        case fail(PickupError)
    }

    /// How a transport error counts.
    enum Classified: Sendable, Equatable {
        case failure(Failure)
        case leave(notice: String)
        case fail(PickupError)
    }

    let limits: Limits
    /// Attempts in a row with no progress anywhere: the give-up budget.
    private(set) var failuresInRow = 0
    /// This connection's failures in a row: its backoff and its retirement.
    private(set) var ownFailures = 0
    private(set) var redirects = 0
    private(set) var triedGivenURLAgain = false
    private(set) var unresolved = 0
    /// Bytes held at the last failure.
    private(set) var heldAtLastFailure: Int64

    init(limits: Limits, held: Int64) {
        self.limits = limits
        heldAtLastFailure = held
    }

    /// The connection goes on with another source: that source's redirects and failures start
    /// from zero (the give-up budget, which counts the whole download's progress, does not).
    mutating func moved() {
        (redirects, ownFailures, triedGivenURLAgain, unresolved) = (0, 0, false, 0)
    }

    /// The connection wrote bytes of the file: its own failures in a row end.
    mutating func wrote() { ownFailures = 0 }

    /// A redirect to follow; the error when there have been too many.
    mutating func redirected() -> PickupError? {
        redirects += 1
        return redirects > limits.maxRedirects ? .server(status: nil, "more than \(limits.maxRedirects) redirects") : nil
    }

    /// A 403, 404 or 410 from where a redirect led: whether to ask the URL the user gave once
    /// more (a signed redirect may have expired).
    mutating func askGivenURLAgain(status: Int, redirectedAway: Bool) -> Bool {
        guard [403, 404, 410].contains(status), redirectedAway, !triedGivenURLAgain else { return false }
        triedGivenURLAgain = true
        return true
    }

    /// How a transport error counts for connection `id` (`stalled`: what to say of a stall, with
    /// the longer wait the next attempt gets).
    mutating func classify(_ error: TransportError, connection id: Int, facts: Facts, stalled: String? = nil) -> Classified {
        switch error {
        case .fatal, .protocolViolation, .refused: return .fail(error.failure)
        case .transient(let m): return .failure(Failure(message: m))
        case .busy(let m):
            // The server's limit on sessions: one connection fewer, unless it is the last.
            if !facts.several, facts.othersFetching { return .leave(notice: Self.retired(id, m)) }
            return .failure(Failure(message: m, busy: true))
        case .stalled: return .failure(Failure(message: stalled ?? error.message))
        case .proxyRefused(let status, _):
            // The proxy's own answer: its 5xx (it cannot reach the server) is retried, its refusals are not.
            return status >= 500 ? .failure(Failure(message: error.message)) : .fail(error.failure)
        case .unresolved(let host):
            // A name that does not resolve rarely starts to: two more tries, then say so.
            unresolved += 1
            return unresolved > 2 ? .fail(.network("cannot resolve \(host)")) : .failure(Failure(message: "cannot resolve \(host)"))
        }
    }

    /// A failure of connection `id`: counted, then what next.
    mutating func failed(_ failure: Failure, connection id: Int, facts: Facts, jitter: Double) -> Action {
        failuresInRow = facts.held > heldAtLastFailure ? 1 : failuresInRow + 1
        ownFailures += 1
        heldAtLastFailure = facts.held
        // Several sources: a busy one takes no more, a failing one is left for another with room,
        // and one that keeps failing is retired (until the held bytes are confirmed, the source
        // that can confirm them is retried in place).
        if facts.several, failuresInRow <= limits.retry.maxAttemptsWithoutProgress, facts.heldConfirmed {
            // One that asks for a longer wait than we give is not waited for while others serve.
            let tooLong = failure.retryAfter.map { Double($0) > limits.retry.maxRetryAfter } ?? false
            return .askSources(failure, tooLong: tooLong)
        }
        return afterSources(failure, connection: id, facts: facts, jitter: jitter)
    }

    /// Retire, back off or give up (with one source, or when the sources said to retry here).
    func afterSources(_ failure: Failure, connection id: Int, facts: Facts, jitter: Double) -> Action {
        let budget = limits.retry.maxAttemptsWithoutProgress
        if ownFailures > limits.retireAfter, facts.othersFetching {
            return .leave(notice: Self.retired(id, "\(ownFailures) failures in a row: \(failure.message)"))
        }
        guard failuresInRow <= budget,
            let delay = limits.retry.delay(failuresInRow: min(ownFailures, budget), retryAfter: failure.retryAfter, jitter: jitter)
        else {
            // The last connection standing keeps the whole budget; the others leave first.
            if facts.othersFetching { return .leave(notice: Self.retired(id, failure.message)) }
            if let after = failure.retryAfter, Double(after) > limits.retry.maxRetryAfter {
                return .fail(.server(status: 503, "\(failure.message); the server asks to retry after \(after) s"))
            }
            return .fail(.network("\(failure.message) (gave up after \(failuresInRow) attempts without progress)"))
        }
        return .backOff(seconds: delay, notice: "\(failure.message); retrying in \(Self.tenths(delay)) s")
    }

    /// `connection 3 retired: why`.
    static func retired(_ id: Int, _ why: String) -> String { "connection \(id + 1) retired: \(why)" }

    /// `1.4`: seconds to one decimal.
    static func tenths(_ seconds: Double) -> String {
        let t = Int((Seconds.clamped(seconds) * 10).rounded())
        return "\(t / 10).\(t % 10)"
    }
}
