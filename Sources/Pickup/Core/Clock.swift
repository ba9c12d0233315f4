import Foundation

/// Clocks used by the engine.
enum Clock {
    /// Seconds since the epoch (for HTTP dates).
    static func wallSeconds() -> Int64 { Int64(Date().timeIntervalSince1970) }

    /// Monotonic seconds, for speeds and intervals.
    static func monotonic() -> Double {
        let d = ContinuousClock.now - start
        return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
    }

    static let start = ContinuousClock.now
}
