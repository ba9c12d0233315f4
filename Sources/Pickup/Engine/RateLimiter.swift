import Atomics
import NIOConcurrencyHelpers

/// A token bucket that caps the bytes per second of every transfer it is attached to (one
/// download's connections, or every download of a ``DownloadManager``). The rate can change at
/// any time, from any thread; nil means unlimited.
///
/// On the per-chunk path an unlimited bucket costs one atomic load. A limited one takes a lock
/// for a few arithmetic operations and answers how long the connection should pause before
/// reading more; the transport turns that into backpressure (no read, no busy wait).
public final class RateLimiter: Sendable {
    private let rate: ManagedAtomic<Int64>
    private let bucket = NIOLockedValueBox(Bucket())

    struct Bucket {
        var tokens: Double = 0
        var last: Double = Clock.monotonic()
    }

    /// A bucket with this rate (nil or 0: unlimited).
    public init(bytesPerSecond: Int64? = nil) {
        rate = ManagedAtomic(max(0, bytesPerSecond ?? 0))
    }

    /// The limit in bytes per second, nil when unlimited. Setting it takes effect on the next chunk.
    public var bytesPerSecond: Int64? {
        get {
            let r = rate.load(ordering: .relaxed)
            return r > 0 ? r : nil
        }
        set { rate.store(max(0, newValue ?? 0), ordering: .relaxed) }
    }

    /// Takes `count` bytes from the bucket; returns the seconds to pause before reading more.
    @inline(__always)
    func take(_ count: Int) -> Double {
        let r = rate.load(ordering: .relaxed)
        guard r > 0 else { return 0 }
        return bucket.withLockedValue { b in
            let now = Clock.monotonic()
            let perSecond = Double(r)
            // A burst of at most a tenth of a second (and at least one 64 KiB read), so a rate
            // change or a pause does not release a flood.
            let burst = max(perSecond / 10, 65536)
            b.tokens = min(burst, b.tokens + (now - b.last) * perSecond)
            b.last = now
            b.tokens -= Double(count)
            return b.tokens >= 0 ? 0 : -b.tokens / perSecond
        }
    }
}
