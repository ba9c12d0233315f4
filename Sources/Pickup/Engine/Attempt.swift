import Foundation

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
        /// A redirect from https to http is followed (`--insecure`).
        var allowInsecureRedirects = false
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
        /// Bytes held from an earlier run are not confirmed yet and this connection's source can
        /// confirm them (a strong validator): a failure there is retried in place, not handed to
        /// the other sources.
        var confirmsHeld = false
        /// The file's length, when known.
        var total: Int64?
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
    /// The URL the next request asks (where the source's redirects led).
    private(set) var url: String
    /// The URL the source was given as.
    private(set) var given: String

    init(limits: Limits, held: Int64, url: String = "", given: String? = nil) {
        self.limits = limits
        heldAtLastFailure = held
        self.url = url
        self.given = given ?? url
    }

    /// The connection goes on with another source, given as `given` and asked at `url`: that
    /// source's redirects and failures start from zero (the give-up budget, which counts the
    /// whole download's progress, does not).
    mutating func moved(to url: String, given: String) {
        (redirects, ownFailures, triedGivenURLAgain, unresolved) = (0, 0, false, 0)
        (self.url, self.given) = (url, given)
    }

    /// The connection wrote bytes of the file: its own failures in a row end.
    mutating func wrote() { ownFailures = 0 }

    /// Follows a redirect to `location` (resolved, and checked as the user's URL is: ``resolveRedirect(_:from:allowInsecure:)``):
    /// ``url`` is asked from now on; the error when there have been too many or the location is unusable.
    mutating func follow(_ location: String) -> PickupError? {
        redirects += 1
        if redirects > limits.maxRedirects { return .server(status: nil, "more than \(limits.maxRedirects) redirects") }
        do throws(PickupError) {
            url = try Self.resolveRedirect(location, from: url, allowInsecure: limits.allowInsecureRedirects)
        } catch {
            return error
        }
        return nil
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
        if facts.several, failuresInRow <= limits.retry.maxAttemptsWithoutProgress, !facts.confirmsHeld {
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

extension Attempt {
    /// What one response came to, as its writer saw it (``answered(_:)``).
    struct Response: Sendable, Equatable {
        /// What the head decided (nil: no head, the transport failed first).
        var decision: ResponseDecision?
        /// The transport's failure, already classified (``classify(_:connection:facts:stalled:)``).
        var failure: Failure?
        /// The range's writer moved forward in this response.
        var advanced = false
        /// Where the range's writer is now.
        var position: Int64 = 0
        /// Where the range ends: its end, or the file's length where that is smaller (`.max`: no
        /// length is known).
        var limit: Int64 = .max
        /// The body ended where its head said.
        var finishedResponse = false
        /// The response's status (0: none).
        var status = 0
        /// The request asked whether a finished file changed.
        var conditional = false
    }

    /// What the connection does after a response (``answered(_:)``).
    enum Step: Sendable, Equatable {
        /// Ask again at once: the next piece of the range on the same connection, or the URL the
        /// user gave once more (``url``).
        case again
        /// Ask again at once at ``url``, where the source redirected.
        case redirected
        /// The range is complete; `lengthIsHeld`: no length was known, and the bytes held are it.
        case done(lengthIsHeld: Bool)
        /// The server says the finished file is unchanged.
        case unchanged
        /// The source's answer makes the connection leave it (``RunState/sourceFault(_:at:_:why:)``).
        case fault(RunState.SourceFault, why: String, status: Int)
        /// A failure to count: ``failed(_:connection:facts:jitter:)`` says what next.
        case failed(Failure)
        /// The download fails.
        case fail(PickupError)
    }

    /// The response `r` ended: what the connection does next. Counts what it wrote, redirects
    /// (and resolves them, checked as the user's URL is) and the one retry of the URL the user
    /// gave after a refusal from where a redirect led.
    mutating func answered(_ r: Response) -> Step {
        if r.advanced, r.decision?.writes == true { wrote() }
        switch r.decision {
        case nil:
            break
        case .append?, .replace?:
            guard r.failure == nil else { break }
            // A whole response to a piece of the range: the next piece is asked for at once.
            if r.position < r.limit, r.finishedResponse { return .again }
            if r.limit != .max, r.position < r.limit {
                return .failed(Failure(message: "the response ended after \(ByteCount.format(r.position)) of \(ByteCount.format(r.limit))"))
            }
            return .done(lengthIsHeld: r.limit == .max)
        case .alreadyComplete?:
            return .done(lengthIsHeld: true)
        case .notModified?:
            return r.conditional ? .unchanged : .done(lengthIsHeld: false)
        case .startOver(let why)?:
            // One mirror's file is not the others' (changed, another length): it goes, not the
            // bytes; the only source's file changed: the run starts over.
            return .fault(.changed, why: why, status: 0)
        case .redirect(let location)?:
            return follow(location).map { .fail($0) } ?? .redirected
        case .retry(let after, let why)?:
            return .failed(Failure(message: why, busy: r.status == 503 || r.status == 429, retryAfter: after))
        case .fail(let status, let why)?:
            // A 403, 404 or 410 from where a redirect led: the URL the user gave is asked once
            // more (a signed redirect may have expired).
            if [403, 404, 410].contains(status), url != given, !triedGivenURLAgain {
                triedGivenURLAgain = true
                url = given
                return .again
            }
            return .fault(.refused, why: why, status: status)
        }
        return r.failure.map { .failed($0) } ?? .again
    }

    /// The absolute URL a `Location` leads to, checked as the user's URL is (``DownloadURL/check(_:)``):
    /// http or https only, and never from https to http unless `allowInsecure`.
    static func resolveRedirect(_ location: String, from current: String, allowInsecure: Bool) throws(PickupError) -> String {
        let shown = DownloadURL.redacted(String(location.prefix(200)))
        guard location.utf8.count <= DownloadURL.maxLength, let base = URL(string: current),
            let next = URL(string: location, relativeTo: base)?.absoluteURL,
            let scheme = next.scheme?.lowercased(), scheme == "http" || scheme == "https"
        else { throw PickupError.server(status: nil, "unusable redirect to '\(shown)'") }
        do throws(PickupError) {
            try DownloadURL.check(next.absoluteString)
        } catch {
            throw PickupError.server(status: nil, "unusable redirect: \(error.description)")
        }
        if base.scheme?.lowercased() == "https", scheme == "http", !allowInsecure {
            throw PickupError.server(status: nil, "refusing redirect from https to http (\(DownloadURL.redacted(next.absoluteString))); use --insecure to allow")
        }
        return next.absoluteString
    }
}
