import Testing

@testable import Pickup

@Suite struct SegmentSchedulerTests {
    let MiB: Int64 = 1 << 20

    /// Two halves, the first owned by connection 0, the second taken by connection 1.
    func twoConnections(total: Int64) -> SegmentScheduler {
        var s = SegmentScheduler(total: total, records: [], minSplit: MiB)
        s.claim(0, by: 0)
        s.plan(connections: 2)
        _ = s.next(for: 1)
        return s
    }

    /// Ranges never overlap and cover the whole file.
    func checkCoverage(_ s: SegmentScheduler) {
        let sorted = s.segments.sorted { $0.start < $1.start }
        #expect(sorted.first?.start == 0)
        #expect(sorted.last?.end == s.total)
        for (a, b) in zip(sorted, sorted.dropFirst()) { #expect(a.end == b.start) }
    }

    @Test func initialPlanSplitsEvenlyForPowersOfTwo() {
        var s = SegmentScheduler(total: 256 * MiB, records: [], minSplit: MiB)
        s.claim(0, by: 0)
        s.plan(connections: 16)
        #expect(s.segments.count == 16)
        #expect(Set(s.segments.map { $0.end - $0.start }) == [16 * MiB])
        checkCoverage(s)
    }

    /// Any count of connections gets ranges that finish together: equal parts of a fresh file, and
    /// parts in proportion to what each range has left of a resumed one.
    @Test func initialPlanSplitsEvenlyForAnyCount() {
        for n in [3, 5, 6, 7, 12] {
            var s = SegmentScheduler(total: 48 * MiB + 5, records: [], minSplit: MiB)
            s.claim(0, by: 0)
            s.plan(connections: n)
            #expect(s.segments.count == n)
            let lengths = s.segments.map { $0.end - $0.start }
            #expect(lengths.max()! - lengths.min()! <= 1, "\(n) connections: \(lengths)")
            checkCoverage(s)
        }
        // Resumed: 30 MiB left in one range, 10 in another; four connections take 3 and 1 parts.
        var r = SegmentScheduler(total: 64 * MiB, records: [
            SegmentRecord(start: 0, end: 40 * MiB, done: 10 * MiB), SegmentRecord(start: 40 * MiB, end: 64 * MiB, done: 14 * MiB),
        ], minSplit: MiB)
        r.plan(connections: 4)
        let left = r.segments.filter { $0.remaining > 0 }.map(\.remaining).sorted()
        #expect(left == [10 * MiB, 10 * MiB, 10 * MiB, 10 * MiB])
        checkCoverage(r)
        // A range that cannot take another part does not stop the others: 1.9 and 5.9 MiB left,
        // six connections: the larger in five parts.
        var uneven = SegmentScheduler(total: 8 * MiB, records: [
            SegmentRecord(start: 0, end: 2 * MiB, done: MiB / 10), SegmentRecord(start: 2 * MiB, end: 8 * MiB, done: MiB / 10),
        ], minSplit: MiB)
        uneven.plan(connections: 6)
        #expect(uneven.segments.filter { $0.remaining > 0 }.count == 6)
        checkCoverage(uneven)
        // The first part keeps its response's end when a minimum piece lies beyond it; the others
        // share the rest.
        var kept = SegmentScheduler(total: 64 * MiB, records: [], minSplit: MiB)
        kept.claim(0, by: 0)
        kept.requesting(0, upTo: 40 * MiB)
        kept.plan(connections: 4)
        #expect(kept.segments[0].end == 40 * MiB && kept.segments.count == 4)
        let others = kept.segments.dropFirst().map { (seg: SegmentScheduler.Segment) -> Int64 in seg.end - seg.start }
        #expect(others == [8 * MiB, 8 * MiB, 8 * MiB])
        checkCoverage(kept)
    }

    /// A split lands where the victim's response ends when at least a minimum piece lies beyond
    /// it (no response is cut, no connection lost); otherwise where the balance says.
    @Test func splitsLandWhereTheVictimsResponseEnds() {
        var s = twoConnections(total: 64 * MiB)
        // Connection 0 reads [0, 24 MiB) of its [0, 32 MiB); connection 1 finishes its half.
        s.requesting(0, upTo: 24 * MiB)
        s.report(0, done: 2 * MiB)
        s.report(1, done: 32 * MiB)
        let a = s.next(for: 1)
        #expect(a?.shrunk?.end == 24 * MiB, "halving would have cut the response at 17 MiB")
        #expect(s.segments[0].end == 24 * MiB)
        checkCoverage(s)
        // The response runs to the range's end: nothing lies beyond it, so the split cuts it.
        var t = twoConnections(total: 64 * MiB)
        t.requesting(0, upTo: 32 * MiB)
        t.report(1, done: 32 * MiB)
        #expect(t.next(for: 1)?.shrunk?.end == 16 * MiB)
        // Less than a minimum piece beyond the response: cut where the balance says.
        var u = twoConnections(total: 64 * MiB)
        u.requesting(0, upTo: 32 * MiB - MiB / 2)
        u.report(1, done: 32 * MiB)
        #expect(u.next(for: 1)?.shrunk?.end == 16 * MiB)
        // A connection that lets go of its range forgets its response.
        u.release(0)
        #expect(u.segments[0].requested == nil)
    }

    /// The first plan keeps the first response whole when it can; shedding ends each other range
    /// where its response ends, so its connection stays open for a restore.
    @Test func thePlanAndSheddingKeepResponsesWhole() {
        var s = SegmentScheduler(total: 64 * MiB, records: [], minSplit: MiB)
        s.claim(0, by: 0)
        s.requesting(0, upTo: 40 * MiB)
        s.plan(connections: 2)
        #expect(s.segments.map(\.end) == [40 * MiB, 64 * MiB])
        _ = s.next(for: 1)
        s.requesting(1, upTo: 48 * MiB)
        s.report(0, done: 10 * MiB)
        s.report(1, done: 2 * MiB)
        let keeper = s.shed(rates: [0: 100, 1: 1])
        #expect(keeper == 0)
        #expect(s.segments[1].end == 48 * MiB, "the other range ends where its response ends")
        #expect(s.segments.last?.start == 48 * MiB && s.segments.last?.owner == nil)
        #expect(s.hasUnowned)
        checkCoverage(s)
    }

    /// Random files, holes and connection counts (seeded; `PICKUP_PLAN_SEED` replays one): the
    /// plan's ranges never overlap, cover the file, each has at least a minimum piece left or was
    /// there before, and there are never more than the connections asked for.
    @Test func randomPlansCoverTheFileInRangesOfAMinimumPiece() {
        let seed = propertySeed("PICKUP_PLAN_SEED", "plan property test")
        var random = SplitMix(state: seed)
        func pick(_ n: UInt64) -> UInt64 { random.next() % n }
        for trial in 0..<500 {
            let total: Int64 = pick(8) == 0 ? .max : Int64(pick(1 << 40)) + 1
            let minSplit = Int64(pick(1 << 24)) + 1
            // Up to four holes: ranges with some of their bytes done.
            var bounds = (0..<Int(pick(4))).map { _ in Int64(pick(UInt64(total))) }
            bounds = Array(Set(bounds + [0, total])).sorted()
            let records = zip(bounds, bounds.dropFirst()).map { a, b in
                SegmentRecord(start: a, end: b, done: Int64(pick(UInt64(b - a) + 1)))
            }
            let connections = Int(pick(33)) + 1
            var s = SegmentScheduler(total: total, records: records, minSplit: minSplit)
            let left = s.segments.map(\.remaining).filter { $0 > 0 }
            let before = left.count
            // Each range takes as many parts as it has minimum pieces left (one at least), up to the connections.
            let room = left.reduce(Int64(0)) { $0 + min(Int64(connections), max(1, $1 / minSplit)) }
            let expected = before >= connections ? before : Int(min(Int64(connections), room))
            s.plan(connections: connections)
            let live = s.segments.filter { $0.remaining > 0 }
            let bounded = live.count <= max(before, connections)
            let added = s.segments.dropFirst(records.count)
            let longEnough = added.allSatisfy { (seg: SegmentScheduler.Segment) -> Bool in seg.end - seg.start >= minSplit }
            #expect(bounded, "trial \(trial), seed \(seed)")
            #expect(live.count == expected, "trial \(trial), seed \(seed): \(live.count) ranges, \(expected) expected")
            #expect(longEnough, "trial \(trial), seed \(seed)")
            checkCoverage(s)
        }
    }

    @Test func neverSplitsBelowTheMinimum() {
        var s = SegmentScheduler(total: 3 * MiB, records: [], minSplit: MiB)
        s.plan(connections: 16)
        #expect(s.segments.count == 3 && s.segments.allSatisfy { $0.end - $0.start >= MiB })
        var t = SegmentScheduler(total: 3 * MiB - 1, records: [], minSplit: MiB)
        t.plan(connections: 16)
        #expect(t.segments.count == 2 && t.segments.allSatisfy { $0.end - $0.start >= MiB })
        checkCoverage(s)
        checkCoverage(t)
    }

    @Test func freeConnectionTakesUnownedWorkFirstThenHalfOfTheLargest() {
        var s = SegmentScheduler(total: 100 * MiB, records: [], minSplit: MiB)
        s.claim(0, by: 0)
        s.plan(connections: 2)
        #expect(s.next(for: 1) == .init(segment: 1, shrunk: nil))
        // Connection 1 finishes its half; connection 0 has done 10 MiB of its 50.
        s.report(1, done: 50 * MiB)
        s.report(0, done: 10 * MiB)
        let a = s.next(for: 1)
        #expect(a?.shrunk?.segment == 0)
        #expect(a?.shrunk?.end == 30 * MiB)  // half of the remaining 40 MiB
        #expect(s.segments[a!.segment].start == 30 * MiB)
        #expect(s.segments[a!.segment].end == 50 * MiB)
        checkCoverage(s)
    }

    @Test func splitsByMeasuredSpeedSoBothFinishTogether() {
        var s = twoConnections(total: 100 * MiB)
        s.report(1, done: 50 * MiB)
        s.report(0, done: 5 * MiB)  // 45 MiB left at 2 MiB/s; the thief does 20 MiB/s
        let a = s.next(for: 1, rates: [0: 2 * 1_048_576], thiefRate: 20 * 1_048_576)
        let keep = s.segments[0].end - s.segments[0].next
        #expect(a?.shrunk?.segment == 0)
        let expected: Double = 45.0 / 11.0 * Double(MiB)  // 45 * 2/22
        let off: Double = abs(Double(keep) - expected)
        #expect(off < Double(MiB) / 100)
        // The victim is the range that would finish last, not the longest.
        var t = twoConnections(total: 100 * MiB)
        t.report(0, done: 40 * MiB)  // 10 MiB left, fast
        t.report(1, done: 30 * MiB)  // 20 MiB left... but connection 1 is slower still
        let b = t.next(for: 2, rates: [0: 100, 1: 1_000_000], thiefRate: 1_000_000)
        #expect(b?.shrunk?.segment == 0)
        checkCoverage(s)
        checkCoverage(t)
    }

    @Test func slowConnectionKeepsShrinking() {
        var s = SegmentScheduler(total: 64 * MiB, records: [], minSplit: MiB)
        s.claim(0, by: 0)
        s.plan(connections: 4)
        for id in 1...3 { _ = s.next(for: id) }
        // The three fast ones finish again and again while connection 0 crawls.
        var steals = 0
        for _ in 0..<20 {
            for id in 1...3 {
                for i in s.segments.indices where s.segments[i].owner == id { s.report(i, done: s.segments[i].end - s.segments[i].start) }
                if let a = s.next(for: id) {
                    if a.shrunk?.segment == 0 { steals += 1 }
                } else {
                    s.release(id)
                }
            }
        }
        #expect(steals > 0)
        #expect(s.segments[0].end - s.segments[0].start < 2 * MiB)  // only a small head is left to the slow one
        checkCoverage(s)
    }

    @Test func releasedRangesAreTakenOverWithTheirProgress() {
        var s = twoConnections(total: 10 * MiB)
        s.report(1, done: 2 * MiB)
        s.release(1)  // connection 1 retired
        #expect(s.activeConnections == 1)
        let a = s.next(for: 2)
        #expect(a?.segment == 1)
        #expect(s.segments[1].next == 7 * MiB)
        checkCoverage(s)
    }

    @Test func resumesFromRecords() {
        let records = [SegmentRecord(start: 0, end: 5 * MiB, done: 5 * MiB), SegmentRecord(start: 5 * MiB, end: 10 * MiB, done: MiB)]
        var s = SegmentScheduler(total: 10 * MiB, records: records, minSplit: MiB)
        #expect(s.doneBytes == 6 * MiB)
        #expect(!s.isComplete)
        #expect(s.next(for: 0)?.segment == 1)
        s.report(1, done: 5 * MiB)
        #expect(s.isComplete)
        #expect(s.records.map(\.done) == [5 * MiB, 5 * MiB])
    }

    /// Connection 1 is out of work; connection 0 has 40 KiB left of its half (far below the
    /// minimum split) at 20 MiB/s, on a server whose new requests answer in 1 ms.
    func endgame() -> SegmentScheduler {
        var s = twoConnections(total: 4 * MiB)
        s.report(1, done: 2 * MiB)
        s.report(0, done: 2 * MiB - 40 * 1024)
        return s
    }

    @Test func endgameTakesAStalledTailWholeHoweverSmall() {
        var s = endgame()
        // 40 KiB at 20 MiB/s is 2 ms of work; no progress for 50 ms is a stall.
        let q = SegmentScheduler.Quiet(seconds: 0.05, rate: 20 * Double(MiB), latency: 0.001)
        let a = s.next(for: 1, rates: [0: 20 * Double(MiB)], thiefRate: 20 * Double(MiB), connections: 2, quiet: [0: q])
        #expect(a?.shrunk?.segment == 0)
        #expect(a?.shrunk?.end == 2 * MiB - 40 * 1024)  // the stalled connection keeps nothing more
        #expect(s.segments[a!.segment].start == 2 * MiB - 40 * 1024)
        #expect(s.segments[a!.segment].end == 2 * MiB)
        #expect(s.segments[0].remaining == 0)
        checkCoverage(s)
    }

    @Test func endgameLeavesARangeThatIsMerelyBetweenReads() {
        // Quiet for less than twice what its rest takes at its speed.
        var s = endgame()
        let slow = SegmentScheduler.Quiet(seconds: 0.05, rate: 1 * Double(MiB), latency: 0.001)  // 40 KiB: 39 ms of work
        #expect(s.next(for: 1, connections: 2, quiet: [0: slow]) == nil)
        // Quiet for less than twice what a new request takes to answer.
        let far = SegmentScheduler.Quiet(seconds: 0.05, rate: 20 * Double(MiB), latency: 0.03)
        #expect(s.next(for: 1, connections: 2, quiet: [0: far]) == nil)
        // Without a measure of quiet, nothing below the minimum split is taken.
        #expect(s.next(for: 1, connections: 2) == nil)
        #expect(s.segments.count == 2)
        #expect(s.segments[0].end == 2 * MiB)
        // The stall threshold itself.
        #expect(slow.stallTime(remaining: 40 * 1024) > 0.05)
        #expect(far.stallTime(remaining: 40 * 1024) == 0.06)
    }
}
