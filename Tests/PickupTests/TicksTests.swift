import Testing

@testable import Pickup

@Suite struct TicksTests {
    /// The monitor's ticks: progress every interval (a tenth early is on time), a checkpoint at the
    /// first tick after its interval, a write-behind every so many bytes; nothing before the start
    /// or after the stop.
    @Test func ticksFindWhatIsDue() {
        var t = Ticks(progressEvery: 1, checkpointEvery: 5, writeBehindEvery: 100)
        #expect(t.tick(now: 10, written: 1000) == Ticks.Due(), "not started: nothing is due")
        t.start(now: 0)
        #expect(t.tick(now: 0.5, written: 50) == Ticks.Due())
        let first = t.tick(now: 0.95, written: 120)
        #expect(first.progress != nil && !first.checkpoint && first.writeBehind)
        #expect(t.tick(now: 1.2, written: 150) == Ticks.Due(), "the next report a second later, the next write-behind 100 bytes later")
        let second = t.tick(now: 2, written: 220)
        #expect(abs((second.progress ?? 0) - 100 / 1.05) < 1e-9, "the speed over the meter's window: 100 bytes since the first report")
        #expect(second.writeBehind)
        #expect(t.tick(now: 5.01, written: 230).checkpoint)
        #expect(!t.tick(now: 6, written: 230).checkpoint)
        t.monitored = false
        #expect(t.tick(now: 20, written: 10_000) == Ticks.Due())
    }
}
