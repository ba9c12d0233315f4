/// Speed over a sliding window of samples, so a display shows a steady figure rather than the
/// speed of the last chunk.
public struct SpeedMeter: Sendable {
    var samples: [(time: Double, bytes: Int64)] = []
    /// Width of the window, in seconds.
    public let window: Double

    /// A meter over `window` seconds.
    public init(window: Double = 5) { self.window = window }

    /// Adds a sample (monotonic seconds, cumulative bytes) and returns bytes per second.
    public mutating func add(time: Double, bytes: Int64) -> Double {
        samples.append((time, bytes))
        while let first = samples.first, time - first.time > window, samples.count > 2 { samples.removeFirst() }
        guard let first = samples.first, time - first.time > 0 else { return 0 }
        return Double(bytes - first.bytes) / (time - first.time)
    }

    /// Forgets the history (after a restart from zero).
    public mutating func reset() { samples.removeAll() }
}
