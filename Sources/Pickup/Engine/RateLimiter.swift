import Atomics
import NIOConcurrencyHelpers

/// A token bucket that caps the bytes per second of every transfer it is attached to (one
/// download's connections, or every download of a ``DownloadManager``). The rate can change at
/// any time, from any thread; nil means unlimited.
///
/// On the per-chunk path an unlimited bucket costs one atomic load. A limited one takes a lock
/// for a few arithmetic operations and answers how long the connection should pause before
/// reading more; the transport turns that into backpressure (no read, no busy wait), and a
/// cancellation ends the pause at once.
///
/// The bucket runs into debt: a chunk larger than the tokens held is taken whole and the
/// connection pauses until the debt is paid, so the average holds at any chunk size. Rates below
/// ``minimum`` are raised to it (the CLI and the API refuse them).
public final class RateLimiter: Sendable {
    /// The lowest rate a limiter keeps, in bytes per second.
    public static let minimum: Int64 = 1024

    private let rate: ManagedAtomic<Int64>
    private let bucket = NIOLockedValueBox(Bucket())

    struct Bucket {
        var tokens: Double = 0
        var last: Double = Clock.monotonic()
        /// When the last pause it asked for ends (-infinity: it never asked for one).
        var pausedUntil: Double = -.infinity
    }

    /// A bucket with this rate (nil or 0: unlimited).
    public init(bytesPerSecond: Int64? = nil) {
        rate = ManagedAtomic(Self.clamped(bytesPerSecond))
    }

    /// The limit in bytes per second, nil when unlimited. Setting it takes effect on the next chunk.
    public var bytesPerSecond: Int64? {
        get {
            let r = rate.load(ordering: .relaxed)
            return r > 0 ? r : nil
        }
        set { rate.store(Self.clamped(newValue), ordering: .relaxed) }
    }

    /// 0 for no limit, else at least ``minimum``.
    static func clamped(_ r: Int64?) -> Int64 {
        guard let r, r > 0 else { return 0 }
        return max(minimum, r)
    }

    /// Checks a rate a person asked for: nil (no limit) or at least ``minimum``.
    /// - Throws: ``PickupError/invalidInput(_:)``.
    public static func validate(_ bytesPerSecond: Int64?) throws(PickupError) {
        if let r = bytesPerSecond, r < minimum {
            throw .invalidInput("a speed limit must be at least \(minimum) bytes per second (1K), not \(r)")
        }
    }

    /// Takes `count` bytes from the bucket; returns the seconds to pause before reading more.
    @inline(__always)
    func take(_ count: Int) -> Double {
        let r = rate.load(ordering: .relaxed)
        guard r > 0 else { return 0 }
        return bucket.withLockedValue { b in
            let now = Clock.monotonic()
            let perSecond = Double(r)
            // Credit of at most a tenth of a second, so a rate change or an idle spell does not
            // release a flood; debt (a chunk larger than the credit) is paid by pausing.
            let burst = perSecond / 10
            b.tokens = min(burst, b.tokens + (now - b.last) * perSecond)
            b.last = now
            b.tokens -= Double(count)
            guard b.tokens < 0 else { return 0 }
            let pause = -b.tokens / perSecond
            b.pausedUntil = max(b.pausedUntil, now + pause)
            return pause
        }
    }

    /// Whether this limit is what holds the transfers it is attached to back: they go at
    /// `bytesPerSecond` (measured over all of them), within a fifth of the limit, and one of them
    /// is paused by it or was in the last second. A server or network slower than the limit seldom
    /// passes both (the pauses alone are not enough: a chunk larger than the small credit pauses
    /// its connection whatever the speed). `stalled`: a connection went without data longer than
    /// the stall timeout; while the limit pauses connections that is the limit's doing (a paused
    /// connection reads nothing), whatever the speed its retries leave.
    public func holds(atSpeed bytesPerSecond: Double, stalled: Bool = false) -> Bool {
        let r = rate.load(ordering: .relaxed)
        guard r > 0, stalled || bytesPerSecond >= Double(r) * 0.8 else { return false }
        return bucket.withLockedValue { Clock.monotonic() <= $0.pausedUntil + 1 }
    }
}
