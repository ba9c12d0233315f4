/// When to try again after a transient failure, and when to give up.
///
/// Only attempts in a row that made no progress use up the budget, so a link that drops every
/// megabyte still finishes; each retry resumes from the current offset.
public struct RetryPolicy: Sendable, Equatable {
    /// Attempts in a row without a single new byte before giving up.
    public var maxAttemptsWithoutProgress: Int
    /// Delay before the first retry, in seconds; doubles with each failure in a row.
    public var baseDelay: Double
    /// Upper bound of the computed delay, in seconds.
    public var maxDelay: Double
    /// The longest `Retry-After` honoured; a server asking for more makes the download fail.
    public var maxRetryAfter: Double

    /// A policy; the defaults suit interactive use.
    public init(maxAttemptsWithoutProgress: Int = 6, baseDelay: Double = 0.5, maxDelay: Double = 30, maxRetryAfter: Double = 600) {
        self.maxAttemptsWithoutProgress = maxAttemptsWithoutProgress
        self.baseDelay = baseDelay
        self.maxDelay = maxDelay
        self.maxRetryAfter = maxRetryAfter
    }

    /// Seconds to wait before the next attempt, or nil to give up.
    /// - Parameters:
    ///   - failuresInRow: attempts in a row without progress, including the one that just failed.
    ///   - retryAfter: the server's `Retry-After`, in seconds, if it sent one.
    ///   - jitter: a number in 0...1 (random in production, fixed in tests).
    public func delay(failuresInRow: Int, retryAfter: Int64?, jitter: Double) -> Double? {
        guard failuresInRow <= maxAttemptsWithoutProgress else { return nil }
        if let retryAfter {
            return Double(retryAfter) <= maxRetryAfter ? Double(retryAfter) : nil
        }
        let exp = baseDelay * Double(1 << min(max(failuresInRow - 1, 0), 20))
        let capped = min(exp, maxDelay)
        return capped * (0.5 + 0.5 * jitter)  // "equal jitter": never less than half the backoff
    }
}
