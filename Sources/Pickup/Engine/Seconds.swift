import NIOCore

/// Seconds as a `Double` (options, settings, the API, computed delays) turned into the integer
/// counts that timers and `Task.sleep` take, without a trap: converting `inf`, `nan` or `1e300`
/// to an integer traps, so every such conversion goes through here. Values from outside are also
/// checked where they come in (``isValid(_:upTo:)``), with a message; this is the last guard.
public enum Seconds {
    /// The longest wait a timer is given: a year. Longer is treated as this.
    public static let longest: Double = 366 * 86_400

    /// `seconds` within 0 ... ``longest`` (nan is 0).
    public static func clamped(_ seconds: Double) -> Double {
        seconds.isNaN ? 0 : min(max(seconds, 0), longest)
    }

    /// Nanoseconds for `Task.sleep(nanoseconds:)`.
    public static func nanoseconds(_ seconds: Double) -> UInt64 {
        UInt64(clamped(seconds) * 1e9)
    }

    /// A NIO time amount, to the millisecond.
    public static func timeAmount(_ seconds: Double) -> TimeAmount {
        .milliseconds(Int64(clamped(seconds) * 1000))
    }

    /// Whether a value from outside is a number of seconds a wait may have: finite, positive and at
    /// most `upTo`.
    public static func isValid(_ seconds: Double, upTo limit: Double = 86_400) -> Bool {
        seconds.isFinite && seconds > 0 && seconds <= limit
    }
}
