import Foundation
import Testing

@testable import Pickup

/// A property test of ``RunState`` alone: thousands of random event sequences (the length
/// learnt, ranges planned, writers writing, connections taking ranges and giving them back, the
/// tuner's trial and shedding, checkpoints whose fsync and store come later, restarts, kills followed by a
/// recovery, the finish), checked after every event against a model of the disk:
/// - the ranges (the scheduler's and the record's, one shape) cover the file exactly once;
/// - no range of the record, nor of any control file stored, claims a byte that is not durable.
@Suite struct RunStateTests {
    /// The disk as the model sees it: which bytes are written, which are durable (fsynced).
    struct Disk {
        var written: [Bool]
        var durable: [Bool]
        init(_ n: Int) {
            written = Array(repeating: false, count: n)
            durable = Array(repeating: false, count: n)
        }
    }

    static func checkCover(_ segments: [(start: Int64, end: Int64)], total: Int64) -> Bool {
        var at: Int64 = 0
        for s in segments.sorted(by: { $0.start < $1.start }) {
            guard s.start == at, s.end >= s.start else { return false }
            at = s.end
        }
        return at == total
    }

    static func claimsOnlyDurable(_ record: ControlRecord, _ disk: Disk) -> Bool {
        record.segments.allSatisfy { s in
            s.done >= 0 && s.done <= (s.end ?? .max) - s.start
                && (s.start..<(s.start + s.done)).allSatisfy { Int($0) < disk.durable.count && disk.durable[Int($0)] }
        }
    }

    @Test func theFirstPartialResponseDecidesOnMoreConnectionsOnlyWithAStrongValidator() throws {
        let strong = Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        let weak = Validators(etag: EntityTag("W/\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        var s = RunState(record: ControlRecord.empty(url: "u"), minSplit: 100)
        let first = s.partialResponse(segment: 0, at: 0, total: 1000, validators: strong, digest: nil, connections: 4)
        #expect(first.described && first.running == 4 && first.decidedTotal == 1000 && s.scheduler?.segments[0].end == 250)
        #expect(s.record.segments.map { $0.end ?? -1 }.sorted() == [250, 500, 750, 1000])
        #expect(s.record.validators == strong && s.record.totalLength == 1000)
        let second = try #require(s.record.segments.firstIndex { $0.start == 500 })
        let later = s.partialResponse(segment: second, at: 500, total: 1000, validators: strong, digest: nil, connections: 4)
        #expect(!later.described && later.running == nil && s.scheduler?.segments[second].end == 750, "decided once per round")
        var w = RunState(record: ControlRecord.empty(url: "u"), minSplit: 100)
        let alone = w.partialResponse(segment: 0, at: 0, total: 1000, validators: weak, digest: nil, connections: 4)
        #expect(alone.running == 1 && w.scheduler?.segments[0].end == 1000 && w.record.segments.count == 1)
    }

    @Test func randomEventSequencesKeepTheRangesExactAndClaimOnlyDurableBytes() {
        let seed = ProcessInfo.processInfo.environment["PICKUP_RUNSTATE_SEED"].flatMap { UInt64($0) }
            ?? UInt64.random(in: 1...UInt64(UInt32.max))
        print("run state property test: seed \(seed) (replay with PICKUP_RUNSTATE_SEED=\(seed))")
        var random = SplitMix(state: seed)
        func pick(_ n: Int) -> Int { Int(random.next() % UInt64(max(1, n))) }
        let validators = Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        var events = 0

        for sequence in 0..<1000 {
            let total = Int64(1 + pick(1000))
            let connections = 1 + pick(8)
            var state = RunState(record: ControlRecord.empty(url: "http://h/f"), minSplit: Int64(1 + pick(64)))
            var disk = Disk(Int(total))
            var onDisk: ControlRecord? = nil  // the last control file stored
            var pending: (Checkpoints.Action, fsynced: [Bool])? = nil
            let label = "sequence \(sequence) of seed \(seed)"

            func store(_ action: Checkpoints.Action, fsynced: [Bool]? = nil) {
                switch action {
                case .none: return
                case .store(let r, let v, _):
                    onDisk = r
                    state.stored(r, version: v)
                case .syncAndStore(let r, let v):
                    // The fsync made durable what was written when it ran.
                    let synced = fsynced ?? disk.written
                    for i in synced.indices where synced[i] && i < disk.durable.count { disk.durable[i] = true }
                    onDisk = r
                    state.stored(r, version: v)
                }
            }
            /// The writers as the engine hands them to the state's events, sampled from the cursors
            /// the state keeps (no speeds: at time 0 no cursor has run long enough to measure).
            func sampled() -> [Int: RunState.Writer] { state.writers(now: 0) }
            /// A writer starts on range `index` at `next` (its end the state's to lower).
            func write(_ index: Int, start: Int64, next: Int64, end: Int64?) {
                state.writes(SegmentCursor(segment: index, start: start, position: next, end: end))
            }
            /// A round starts and its first response (a 206 with the length) plans the ranges.
            func startFresh() {
                let first = state.record.segments[0]
                write(0, start: first.start, next: first.start + first.done, end: first.end)
                state.newRound(connections: connections)
                _ = state.partialResponse(segment: 0, at: first.start + first.done, total: total, validators: validators, digest: nil,
                                          connections: connections)
            }
            startFresh()

            for _ in 0..<(20 + pick(60)) {
                events += 1
                switch pick(10) {
                case 0, 1, 2:  // a writer writes, as the data path does: up to the end its cursor says
                    let ranges = state.cursors.keys.sorted()  // (in a seeded order, not the dictionary's)
                    guard !ranges.isEmpty, let c = state.cursors[ranges[pick(ranges.count)]] else { break }
                    let pos = c.position.load(ordering: .relaxed), end = min(c.end.load(ordering: .relaxed), total)
                    guard pos < end else { break }
                    let n = Int64(1 + pick(Int(end - pos)))
                    for b in pos..<(pos + n) { disk.written[Int(b)] = true }
                    c.position.store(pos + n, ordering: .relaxed)
                case 3:  // a connection asks for work
                    let id = pick(connections)
                    let a = state.assign(id, unownedOnly: pick(4) == 0, writers: sampled(), now: 0, connections: connections)
                    if let a { write(a.segment, start: a.start, next: a.next, end: a.end) }
                case 4:  // a connection gives its range back
                    state.connectionLeft(pick(connections))
                case 5:  // a checkpoint: the record is taken now, the fsync and store come later
                    if pending == nil {
                        pending = (state.checkpoint(), disk.written)
                    }
                case 6:  // the pending checkpoint's fsync and store complete
                    if let (action, synced) = pending {
                        pending = nil
                        store(action, fsynced: synced)
                    }
                case 7:  // the tuner tries one connection (holding the others), sheds to it, or brings them back
                    switch pick(3) {
                    case 0: state.connectionsRestored()
                    case 1: _ = state.holdConnections(writers: sampled())
                    default: state.shedConnections(writers: sampled())
                    }
                case 8:  // the representation changed: everything is discarded
                    if pick(4) == 0 {
                        pending = nil
                        let action = state.restarted { r in
                            r.validators = nil
                            r.totalLength = nil
                            r.segments = [SegmentRecord(start: 0, end: nil, done: 0)]
                        }
                        disk = Disk(Int(total))  // truncated
                        #expect(state.cursors.isEmpty, "\(label): a restart keeps writers")
                        store(action)
                        startFresh()
                    }
                default:  // killed, then recovered from the control file and the cursors (same boot)
                    pending = nil
                    guard let rec = onDisk else { break }
                    // The cursor file's slots: each writer's range start and its next byte.
                    let cursorRanges = state.cursors.values.map { c -> (start: Int64, end: Int64) in (c.start, c.position.load(ordering: .relaxed)) }
                    let partialSize = Int64(disk.written.lastIndex(of: true).map { $0 + 1 } ?? 0)
                    state = RunState(record: ControlRecord.empty(url: "http://h/f"), minSplit: state.minSplit)
                    switch Recovery.decide(.init(record: rec, controlExists: true, partialSize: partialSize, written: cursorRanges),
                                           url: "http://h/f") {
                    case .resume(let r, let merged):
                        state.loaded(r)
                        if let merged { store(state.recovered(merged)) }
                        let first = state.firstRange()
                        write(first.index, start: first.start, next: first.start + first.done, end: first.end)
                    case .startOver, .anotherURL, .fresh:
                        disk = Disk(Int(total))
                        onDisk = nil
                        startFresh()
                    }
                }
                // The invariants.
                if let s = state.scheduler {
                    // Every writer stops at its range's end as the ranges say it now.
                    let overrun = state.cursors.values.filter { c in
                        guard let end = state.end(ofRange: c.segment, startingAt: c.start) else { return false }
                        return c.end.load(ordering: .relaxed) > end
                    }
                    #expect(overrun.isEmpty, "\(label): a writer's end is past its range's: \(overrun.map { ($0.segment, $0.end.load(ordering: .relaxed)) })")
                    let shape = s.segments.map { (start: $0.start, end: $0.end) }
                    #expect(Self.checkCover(shape, total: total), "\(label): the ranges do not cover the file once: \(shape)")
                    let recordStarts: [Int64] = state.record.segments.map(\.start)
                    let recordEnds: [Int64] = state.record.segments.map { $0.end ?? -1 }
                    let same = recordStarts == s.segments.map(\.start) && recordEnds == s.segments.map(\.end)
                    #expect(same, "\(label): the record's ranges are not the scheduler's")
                }
                let recordOK = Self.claimsOnlyDurable(state.record, disk)
                #expect(recordOK, "\(label): the record claims bytes not durable")
                let storedOK = onDisk.map { Self.claimsOnlyDurable($0, disk) } ?? true
                #expect(storedOK, "\(label): a stored control file claims bytes not durable")
            }
            // The finish: every byte written, fsynced, the record complete.
            if let s = state.scheduler, s.isComplete {
                disk.durable = disk.written
                store(state.finishing(size: total, verifying: true))
                #expect(state.record.durableBytes == total || onDisk == nil, "\(label): finished short")
            }
        }
        print("run state property test: 1000 sequences, \(events) events")
    }

    @Test func beforeAnAttemptAConnectionStopsMovesOrConfirmsTheHeldBytesFirst() {
        let strong = Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        func fresh() -> RunState {
            var s = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                             sources: SourceSet(urls: ["http://a/f", "http://b/f"], connections: 2))
            var held = ControlRecord.empty(url: "http://a/f")
            held.segments = [SegmentRecord(start: 0, end: nil, done: 500)]
            s.loaded(held)
            #expect(s.started() == 500)  // bytes from an earlier run, not confirmed yet
            let started = s.connectionStarted(0, asking: 0)
            #expect(started)
            return s
        }
        // Held bytes and no source with a strong validator: none can confirm them.
        var s = fresh()
        let before1 = s.beforeAttempt(0, at: 0, holding: true)
        #expect(before1 == .noConfirmer)
        // A mirror with one confirms them: the connection moves there.
        s = fresh()
        s.describe { $0.setValidators(strong, of: 1) }
        let before2 = s.beforeAttempt(0, at: 0, holding: true)
        #expect(before2 == .go(source: 1, several: true, validators: strong, total: nil, patience: 0))
        // Nothing held in its range: it asks where it was.
        s = fresh()
        let before3 = s.beforeAttempt(0, at: 0, holding: false)
        #expect(before3 == .go(source: 0, several: true, validators: nil, total: nil, patience: 0))
        // Its source retired: another with room.
        s = fresh()
        let (after, notice) = s.sourceFault(1, at: 0, .refused, why: "gone")
        #expect(after == .moveTo(1) && notice != nil)
        let before4 = s.beforeAttempt(0, at: 0, holding: false)
        #expect(before4 == .go(source: 1, several: true, validators: nil, total: nil, patience: 0))
        // Another connection goes on alone: it stops.
        s = fresh()
        s.fetchAlone(1)
        let before5 = s.beforeAttempt(0, at: 0, holding: false)
        #expect(before5 == .stop)
    }

    /// A connection's life is the state's say, event by event: it opens on the first range (asking
    /// the URL given), or on a share of another's once the length is known; one that no source
    /// has room for never opens; a retired one stops; out of work, it stops.
    @Test func aConnectionDoesWhatTheStateSaysEventByEvent() throws {
        let strong = Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        var s = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                         sources: SourceSet(urls: ["http://a/f"], connections: 2))
        s.newRound(connections: 2)
        guard case .fetch(let first, asked: true) = s.connection(0, .opens(finishedAt: nil), now: 0, connections: 2) else {
            Issue.record("the first connection fetches the first range, asking the URL given"); return
        }
        #expect(first.start == 0 && first.position.load(ordering: .relaxed) == 0)
        _ = s.partialResponse(segment: 0, at: 0, total: 1000, validators: strong, digest: nil, connections: 2)
        guard case .fetch(let second, asked: false) = s.connection(1, .opens(finishedAt: nil), now: 0, connections: 2) else {
            Issue.record("the second connection fetches a share"); return
        }
        #expect(second.start == 500)
        // The source takes two: a third never opens (and has nothing to leave).
        guard case .none = s.connection(2, .opens(finishedAt: nil), now: 0, connections: 2) else {
            Issue.record("no room, no connection"); return
        }
        // Retired: it stops, and once it has left, its range goes to the next that opens.
        guard case .stop = s.connection(1, .retired, now: 0, connections: 2) else { Issue.record("retired stops"); return }
        s.connectionLeft(1)
        guard case .fetch(let again, asked: false) = s.connection(3, .opens(finishedAt: nil), now: 0, connections: 2) else {
            Issue.record("the range left is taken"); return
        }
        #expect(again.start == 500)
        // Every range written, none left: it stops.
        first.position.store(500, ordering: .relaxed)
        again.position.store(1000, ordering: .relaxed)
        guard case .stop = s.connection(3, .rangeDone, now: 0, connections: 2) else { Issue.record("out of work, it stops"); return }
    }

    /// After a failure the attempt and the sources decide in one look: one source backs off, then
    /// gives up past the budget; with several, a failing one is left for another with room at once.
    @Test func afterAFailureTheAttemptAndTheSourcesDecide() {
        let limits = Attempt.Limits(retry: RetryPolicy(maxAttemptsWithoutProgress: 2, baseDelay: 0.5, maxDelay: 8, maxRetryAfter: 60),
                                    maxRedirects: 3)
        let refused = Attempt.Failure(message: "connection refused")
        var one = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                           sources: SourceSet(urls: ["http://a/f"], connections: 1))
        one.newRound(connections: 1)
        _ = one.connection(0, .opens(finishedAt: nil), now: 0, connections: 1)
        var attempt = Attempt(limits: limits, held: 0)
        let facts = Attempt.Facts(held: 0, othersFetching: false)
        let (first, notices) = one.failed(refused, connection: 0, source: 0, attempt: &attempt, facts: facts, jitter: 0)
        guard case .backOff(let delay) = first else { Issue.record("one source backs off: \(first)"); return }
        #expect(delay > 0 && notices.count == 1 && notices[0].hasPrefix("connection refused; retrying in"))
        _ = one.failed(refused, connection: 0, source: 0, attempt: &attempt, facts: facts, jitter: 0)
        let (last, _) = one.failed(refused, connection: 0, source: 0, attempt: &attempt, facts: facts, jitter: 0)
        guard case .fail(.network) = last else { Issue.record("past the budget it gives up: \(last)"); return }

        var two = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                           sources: SourceSet(urls: ["http://a/f", "http://b/f"], connections: 1))
        two.newRound(connections: 1)
        _ = two.connection(0, .opens(finishedAt: nil), now: 0, connections: 1)
        var other = Attempt(limits: limits, held: 0)
        let (moved, _) = two.failed(refused, connection: 0, source: 0, attempt: &other,
                                    facts: .init(held: 0, othersFetching: false, several: true), jitter: 0)
        #expect(moved == .moveTo(1))
    }

    /// Failures explored: one connection fails again and again at whatever source the state sends
    /// it to, among 1 to 4 sources, each with a strong validator or none, bytes held from an
    /// earlier run or not. Whatever the draw: it never waits in place at a source that cannot
    /// confirm the held bytes while another live source could take it (torture seed
    /// 369392275359), never moves to a retired source nor to the one it is at, and the run ends
    /// (gives up or leaves) within the budget of failures without progress: every wait has a bound.
    @Test func exploredFailuresNeverWaitOnASourceThatCannotConfirmAndEnd() {
        var rng = SplitMix(state: propertySeed("PICKUP_FAILURES_SEED", "exploredFailuresNeverWaitOnASourceThatCannotConfirmAndEnd"))
        let strong = Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        let budget = 4
        let limits = Attempt.Limits(retry: RetryPolicy(maxAttemptsWithoutProgress: budget, baseDelay: 0.5, maxDelay: 8, maxRetryAfter: 60),
                                    maxRedirects: 3)
        for sequence in 0..<500 {
            let count = 1 + Int(rng.next() % 4)
            let urls = (0..<count).map { "http://s\($0)/f" }
            var confirms = (0..<count).map { _ in rng.next() % 2 == 0 }
            let holding = rng.next() % 2 == 0
            if holding, !confirms.contains(true) { confirms[Int(rng.next() % UInt64(count))] = true }
            var s = RunState(record: ControlRecord.empty(url: urls[0]), minSplit: 100, sources: SourceSet(urls: urls, connections: 1))
            if holding {
                var held = ControlRecord.empty(url: urls[0])
                held.totalLength = 1000
                held.segments = [SegmentRecord(start: 0, end: 500, done: 0), SegmentRecord(start: 500, end: 1000, done: 500)]
                s.loaded(held)
                _ = s.started()
            }
            s.describe { r in for (i, c) in confirms.enumerated() where c { r.setValidators(strong, of: i) } }
            s.newRound(connections: 1)
            _ = s.connection(0, .opens(finishedAt: nil), now: 0, connections: 1)
            var at = s.sources.source(of: 0) ?? 0
            var attempt = Attempt(limits: limits, held: holding ? 500 : 0)
            var steps: [String] = []
            var ended = false
            for failure in 1...(budget + 2) {
                let label = "sequence \(sequence): \(count) sources, confirming \(confirms), holding \(holding): \(steps)"
                guard let facts = s.facts(for: 0, holding: holding ? 500 : 0) else { Issue.record("\(label): stopped"); break }
                let busy = rng.next() % 4 == 0
                let (next, _) = s.failed(.init(message: busy ? "503" : "refused", busy: busy), connection: 0, source: at,
                                         attempt: &attempt, facts: facts, jitter: Double(rng.next() % 100) / 100)
                steps.append("\(busy ? "busy" : "failed") at \(at): \(next)")
                switch next {
                case .backOff:
                    // Waiting here: nowhere else to go, or a source that can confirm the held bytes
                    // (or a busy one, asked once more: a busy server is alive).
                    let elsewhere = s.sources.live.contains { $0 != at }
                    #expect(busy || !(count > 1 && holding && !confirms[at] && elsewhere),
                            "\(label): \(steps.last ?? ""): waits at a source that cannot confirm the held bytes while another is live")
                case .moveTo(let to):
                    #expect(to != at && !s.sources.isRetired(to), "\(label): moved to \(to)")
                    at = to
                case .leave, .fail:
                    ended = true
                }
                if ended {
                    #expect(failure <= budget + 1, "\(label): ended late")
                    break
                }
            }
            #expect(ended, "sequence \(sequence): \(count) sources, confirming \(confirms), holding \(holding): never ended: \(steps)")
        }
    }

    /// A resumed run whose first connection's range holds nothing asks the first URL; when that
    /// one has no validator (a dead mirror that never answered) and fails, the connection moves to
    /// the others at once: only a source that can confirm the held bytes is retried in place.
    /// (Torture seed 369392275359: the run retried the dead URL until it gave up.)
    @Test func aSourceThatCannotConfirmTheHeldBytesIsNotRetriedInPlace() {
        let strong = Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        var s = RunState(record: ControlRecord.empty(url: "http://dead/f"), minSplit: 100,
                         sources: SourceSet(urls: ["http://dead/f", "http://b/f"], connections: 2))
        var held = ControlRecord.empty(url: "http://dead/f")
        held.totalLength = 1000
        held.segments = [SegmentRecord(start: 0, end: 500, done: 0), SegmentRecord(start: 500, end: 1000, done: 500)]
        s.loaded(held)
        s.describe { $0.setValidators(strong, of: 1) }
        #expect(s.started() == 500)
        let started = s.connectionStarted(0, asking: 0)
        #expect(started)
        let before = s.beforeAttempt(0, at: 0, holding: false)
        #expect(before == .go(source: 0, several: true, validators: nil, total: 1000, patience: 0))
        // The held bytes are not confirmed, but the dead source cannot confirm them.
        let facts = s.facts(for: 0, holding: 500)
        #expect(facts?.confirmsHeld == false)
        var attempt = Attempt(limits: .init(retry: RetryPolicy(maxAttemptsWithoutProgress: 4, baseDelay: 0.5, maxDelay: 8, maxRetryAfter: 60), maxRedirects: 5), held: 500)
        let action = attempt.failed(.init(message: "connection refused"), connection: 0, facts: facts!, jitter: 0)
        #expect(action == .askSources(.init(message: "connection refused"), tooLong: false))
        let (next, _) = s.attemptFailed(source: 0, connection: 0, .init(message: "connection refused"), tooLong: false)
        #expect(next == .moveTo(1))
        // At the source that can confirm them, a failure is retried in place.
        let there = s.facts(for: 0, holding: 500)
        #expect(there?.confirmsHeld == true)
    }

    /// A source's fault (not this file, changed, refused): with several sources the connection
    /// moves on, the source retired; with one the run starts over, the connection leaves, or the
    /// download fails; nothing of it needs a server.
    @Test func aSourcesFaultMovesTheConnectionOnOrEndsIt() {
        func run(_ urls: [String], connections: [Int] = [0]) -> RunState {
            var s = RunState(record: ControlRecord.empty(url: urls[0]), minSplit: 100,
                             sources: SourceSet(urls: urls, connections: 2))
            s.newRound(connections: 2)
            _ = s.partialResponse(segment: 0, at: 0, total: 10_000, validators: Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false),
                                  source: urls.count - 1, digest: nil, connections: 2)  // (the last source has delivered)
            for c in connections {
                let started = s.connectionStarted(c, asking: 0)
                #expect(started)
                _ = s.assign(c, unownedOnly: false, writers: [:], now: 0, connections: 2)
            }
            return s
        }
        let two = ["http://a/f", "http://b/f"]
        // Several sources, each fault: the source goes, the connection moves to the other.
        for fault in [RunState.SourceFault.notThisFile(otherFile: false), .notThisFile(otherFile: true), .changed, .refused] {
            var s = run(two)
            let (after, notice) = s.sourceFault(0, at: 0, fault, why: "no")
            #expect(after == .moveTo(1), "\(fault)")
            #expect(notice != nil, "\(fault): the retirement is said")
            #expect(s.sources.isRetired(0), "\(fault)")
            // The last live source is not retired: a second connection's fault there leaves.
            let (again, _) = s.sourceFault(0, at: 1, fault, why: "no")
            #expect(!s.sources.isRetired(1), "\(fault): the last live source was retired")
            #expect(again != .moveTo(0), "\(fault): moved to a retired source")
        }
        // A changed file at a source another connection retired a moment ago: moved on, nothing said.
        var s = run(two, connections: [0, 1])
        _ = s.sourceFault(1, at: 0, .changed, why: "changed")
        let (moved, said) = s.sourceFault(0, at: 0, .changed, why: "changed")
        #expect(moved == .moveTo(1) && said == nil)
        // One source: a changed file starts over; a refusal retires the connection while another
        // fetches, and fails the download when it is the last.
        s = run(["http://a/f"], connections: [0, 1])
        #expect(s.sourceFault(0, at: 0, .changed, why: "changed") == (.startOver, nil))
        let (retired, notice) = s.sourceFault(1, at: 0, .refused, why: "HTTP 403")
        #expect(retired == .leave && notice == Attempt.retired(1, "HTTP 403"))
        s.connectionLeft(1)
        #expect(s.sourceFault(0, at: 0, .refused, why: "HTTP 403") == (.fail, nil))
        // Stopped (another connection goes on alone): no facts, the attempt ends.
        s.fetchAlone(1)
        #expect(s.facts(for: 0, holding: 5) == nil)
        #expect(s.facts(for: 1, holding: 5)?.held == 5)
    }

    /// Which connections fetch is one phase: all; one for the tuner's trial or shed, until it
    /// restores the others (or a restart does); one for good once responses disagreed, which
    /// neither the tuner nor a restart undoes. Only the one that fetches gets a range.
    /// Every range's writer 10 bytes past its reported progress, range `i` at `i + 1` bytes/s (the
    /// last range's is the fastest).
    static func writers(_ s: RunState) -> [Int: RunState.Writer] {
        Dictionary(uniqueKeysWithValues: (s.scheduler?.segments.indices ?? 0..<0).map { i in
            let seg = s.scheduler!.segments[i]
            return (i, RunState.Writer(written: seg.done + 10, position: seg.start + seg.done + 10, beganAt: seg.start, began: 0,
                                       rate: Double(i + 1)))
        })
    }

    /// `n` connections, each with a range of a 100,000-byte file.
    static func running(_ n: Int) -> RunState {
        var s = RunState(record: ControlRecord.empty(url: "u"), minSplit: 100)
        s.newRound(connections: n)
        _ = s.partialResponse(segment: 0, at: 0, total: 100_000,
                              validators: Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false),
                              digest: nil, connections: n)
        for c in 0..<n {
            _ = s.connectionStarted(c, asking: 0)
            _ = s.assign(c, unownedOnly: false, writers: [:], now: 0, connections: n)
        }
        return s
    }

    /// A connection's work is one event: it opens on the first unfinished range (connection 0)
    /// or one the state gives it, registered as that range's writer; a held connection gets none
    /// and waits to be brought back, the one kept does not.
    @Test func aConnectionOpensAndTakesWorkInOneEvent() {
        var s = RunState(record: ControlRecord.empty(url: "u"), minSplit: 100)
        s.newRound(connections: 3)
        guard case .fetch(let first, asked: true) = s.connection(0, .opens(finishedAt: nil), now: 0, connections: 3) else {
            Issue.record("connection 0 opens on the first range"); return
        }
        #expect(first.segment == 0 && s.cursors[0] === first)
        // A finished file's check is made at the source its validators are from: a mirror's.
        var m = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                         sources: SourceSet(urls: ["http://a/f", "http://b/f"], connections: 2))
        m.newRound(connections: 2)
        guard case .fetch(_, asked: true) = m.connection(0, .opens(finishedAt: "http://b/f"), now: 0, connections: 2) else {
            Issue.record("connection 0 makes the check"); return
        }
        #expect(m.sources.source(of: 0) == 1, "connection 0 asks the mirror the finished file came from")
        var u = RunState(record: ControlRecord.empty(url: "u"), minSplit: 100)
        u.newRound(connections: 1)
        guard case .fetch(_, asked: true) = u.connection(0, .opens(finishedAt: "http://other/"), now: 0, connections: 1) else {
            Issue.record("connection 0 makes the check"); return
        }
        #expect(u.sources.source(of: 0) == 0, "an unknown source is not asked about; the URL given is")
        _ = s.connection(1, .opens(finishedAt: nil), now: 0, connections: 3)
        #expect(s.sources.source(of: 1) == 0)
        _ = s.partialResponse(segment: 0, at: 0, total: 100_000,
                              validators: Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false),
                              digest: nil, connections: 3)
        let work = s.work(for: 1, now: 0, connections: 3)
        guard let c = work.cursor else { Issue.record("no range for connection 1: \(work)"); return }
        #expect(c.segment != 0 && s.cursors[c.segment] === c, "its writer is registered")
        #expect(c.end.load(ordering: .relaxed) == s.end(ofRange: c.segment, startingAt: c.start), "its end is its range's")
        _ = s.connection(2, .opens(finishedAt: nil), now: 0, connections: 3)
        let keeper = s.holdConnections(writers: Self.writers(s))!
        let held = (0..<3).first { $0 != keeper }!
        var probe = s
        guard case .waitForRestore = probe.connection(held, .rangeDone, now: 1, connections: 3) else {
            Issue.record("a held connection out of work waits to be brought back"); return
        }
        let none = s.work(for: held, endgame: true, now: 1, connections: 3)
        #expect(none.cursor == nil && s.waitsForRestore(held) && !s.waitsForRestore(keeper))
        var t = s
        s.connectionsRestored()
        #expect(!s.waitsForRestore(held))
        // The kept connection leaving with bytes left brings the others back: no wait without end.
        let other = (0..<3).first { $0 != keeper && $0 != held }!
        let otherLeft = t.connectionLeft(other)
        #expect(!otherLeft, "another connection leaving changes nothing")
        let keeperLeft = t.connectionLeft(keeper)
        #expect(keeperLeft && !t.waitsForRestore(held))
    }

    /// Piece checks are the state's to decide: which pieces are whole in the durable bytes, whether
    /// a bad one can be blamed on one source, and a length a source announces against a Metalink
    /// document's.
    @Test func piecesAndLengthsAreDecidedByTheState() {
        let hashes = Metalink.Pieces(length: 100, algorithm: .sha256, hashes: Array(repeating: [0], count: 10))
        var s = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 10,
                         sources: SourceSet(urls: ["http://a/f", "http://b/f", "http://c/f"], connections: 2))
        var held = ControlRecord.empty(url: "http://a/f")
        held.totalLength = 1000
        held.segments = [SegmentRecord(start: 0, end: 500, done: 250), SegmentRecord(start: 500, end: 1000, done: 500)]
        s.loaded(held)
        // Source 2 answered with the file (so another source may be refused for it).
        _ = s.partialResponse(segment: 0, at: 250, end: 500, total: 1000,
                              validators: Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false),
                              source: 2, digest: nil, connections: 1)
        // Durable: [0, 250) and [500, 1000): pieces 0, 1 and 5 to 9 are whole.
        let found = s.piecesToCheck(hashes)
        #expect(found?.todo == [0, 1, 5, 6, 7, 8, 9] && found?.total == 1000)
        // Source 1 wrote [500, 700): a bad piece 5 is its alone; piece 6 too.
        s.wrote(500, 700, by: 1)
        let five = s.pieceHashed(5, good: false, start: 500, end: 600, generation: found!.generation)
        #expect(five?.recorded == true && five?.blame == true)
        #expect(s.pieceHashed(6, good: false, start: 600, end: 700, generation: found!.generation)?.blame == true)
        let zero = s.pieceHashed(0, good: true, start: 0, end: 100, generation: found!.generation)
        #expect(zero?.recorded == true && zero?.blame == false)
        #expect(s.piecesToCheck(hashes)?.todo == [1, 7, 8, 9], "checked pieces are not read again")
        // An old generation records nothing.
        #expect(s.pieceHashed(1, good: true, start: 100, end: 200, generation: found!.generation + 1)?.recorded == false)
        // Bad pieces of source 1, twice: it is rejected, and named.
        let first = s.blame([(500, 600)], now: 0)
        #expect(first.blamed == ["http://b/f"])
        let second = s.blame([(600, 700)], now: 0)
        #expect(second.blamed == ["http://b/f"] && s.sources.isRetired(1) && !second.notices.isEmpty)
        #expect(s.blame([(600, 700)], now: 0).known, "a source rejected already is old news")
        // Lengths against the document's 1000 bytes.
        #expect(s.lengthAnnounced(1000, expected: 1000, source: 2) == .fits)
        if case .rejected(let why, let notice) = s.lengthAnnounced(999, expected: 1000, source: 2) {
            #expect(why.contains("999") && !notice.isEmpty && s.sources.isRetired(2))
        } else {
            Issue.record("another length from a source while others are live: rejected")
        }
        // The last live source announcing none is taken; announcing another length, the download fails.
        #expect(s.lengthAnnounced(nil, expected: 1000, source: 0) == .fits)
        if case .fails(_, let url) = s.lengthAnnounced(5, expected: 1000, source: 0) { #expect(url == "http://a/f") } else {
            Issue.record("another length from the only source left: fails")
        }
    }

    /// A round that ends without the file starts another within the run's budget; responses that
    /// keep disagreeing finish over one connection from the second restart on; past the budget
    /// the run fails with what kept happening.
    @Test func aRoundWithoutTheFileStartsAnotherWithinTheBudget() {
        var s = RunState(record: ControlRecord.empty(url: "u"), minSplit: 100)
        #expect(s.roundEnded(.changed("the ETag changed"), maxRestarts: 3, connections: 4) == .startOver(notice: "the ETag changed; starting over from zero"))
        let second = s.roundEnded(.changed("the ETag changed"), maxRestarts: 3, connections: 4)
        guard case .startOver(let notice) = second else { Issue.record("\(second)"); return }
        #expect(notice.contains("one connection") && s.connections == .alone(0))
        #expect(s.roundEnded(.rangesLeft, maxRestarts: 3, connections: 4) == .again)
        #expect(s.roundEnded(.hashFailed, maxRestarts: 3, connections: 4) == .fail(.verification("the file keeps failing its hash, whichever source its bytes come from")))
        var t = RunState(record: ControlRecord.empty(url: "u"), minSplit: 100)
        #expect(t.roundEnded(.rangesLeft, maxRestarts: 0, connections: 1) == .fail(.network("every connection failed with ranges left to fetch")))
        var u = RunState(record: ControlRecord.empty(url: "u"), minSplit: 100)
        _ = u.roundEnded(.changed("x"), maxRestarts: 5, connections: 1)
        #expect(u.roundEnded(.changed("x"), maxRestarts: 5, connections: 1) == .startOver(notice: "x; starting over from zero"), "one connection: nothing to go alone on")
        var v = RunState(record: ControlRecord.empty(url: "u"), minSplit: 100)
        _ = v.roundEnded(.changed("x"), maxRestarts: 1, connections: 1)
        #expect(v.roundEnded(.changed("x"), maxRestarts: 1, connections: 1) == .fail(.server(status: nil, "x, again after starting over")))
    }

    @Test func whichConnectionsFetchIsOnePhase() {
        let (writers, running) = (Self.writers, Self.running)
        var s = running(4)
        #expect(s.connections == .all)
        let keeper = s.holdConnections(writers: writers(s))
        #expect(keeper != nil && s.connections == .shed(keeper: keeper!))
        let other = (0..<4).first { $0 != keeper }!
        let held = s.assign(other, unownedOnly: false, writers: writers(s), now: 1, connections: 4)
        #expect(held == nil, "a held connection takes no range")
        let wait = s.endgameWait(other, writers: writers(s), now: 1)
        #expect(wait == nil)
        s.connectionsRestored()
        #expect(s.connections == .all)
        // One for good: the tuner's trial neither replaces it nor undoes it, and nor does a restart.
        s.fetchAlone(2)
        let again = s.fetchAlone(3, once: true)
        #expect(!again && s.connections == .alone(2))
        let (hold, shed) = (s.holdConnections(writers: writers(s)), s.shedConnections(writers: writers(s)))
        #expect(hold == nil && !shed)
        s.connectionsRestored()
        _ = s.restarted { _ in }
        #expect(s.connections == .alone(2) && s.isStopped(0) && !s.isStopped(2) && s.connectionsAllowed(4) == 1)
        // A restart ends a trial.
        var t = running(2)
        let shed2 = t.shedConnections(writers: writers(t))
        #expect(shed2)
        _ = t.restarted { _ in }
        #expect(t.connections == .all)
    }

    /// The tuner's samples are one event on the run: a busy process's trial holds every
    /// connection but the fastest writer's; one connection as fast keeps the shed (the held ranges
    /// end where they are), one clearly slower brings the others back; after that, nothing.
    @Test func theTunersDecisionIsCarriedOutOnTheConnectionsInOneEvent() {
        let (writers, running) = (Self.writers, Self.running)  // (range 3's writer is the fastest of four)
        /// A busy process (two CPU seconds a second on two threads) at 4,000 bytes/s.
        func sample(_ t: Double) -> ConnectionTuner.Sample { .init(time: t, cpu: 2 * t, bytes: Int64(4000 * t), connections: 4) }
        /// Samples until the trial starts: its keeper.
        func trial(_ s: inout RunState) -> Int? {
            s.startTuning(ConnectionTuner(threads: 2), with: sample(0))
            for t in [0.05, 0.1] {
                let step = s.tunerSampled(sample(t), trialBytes: nil, writers: writers(s))
                #expect(step.action == nil && step.then == nil && s.connections == .all)
            }
            let step = s.tunerSampled(sample(0.15), trialBytes: nil, writers: writers(s))
            guard case .trial(let keeper)? = step.then else {
                Issue.record("no trial: \(step)")
                return nil
            }
            #expect(step.action == .shed && s.connections == .shed(keeper: keeper) && s.tuning)
            #expect(s.scheduler?.segments[3].owner == keeper, "the fastest writer's connection goes on")
            return keeper
        }

        // No tuner: nothing.
        var none = running(4)
        let nothing = none.tunerSampled(sample(1), trialBytes: nil, writers: writers(none))
        #expect(nothing.action == nil && nothing.then == nil && !none.tuning)

        // One connection as fast as four: the shed stands, the held ranges end where their writers are.
        var s = running(4)
        guard let keeper = trial(&s) else { return }
        _ = s.tunerSampled(sample(0.2), trialBytes: 0, writers: writers(s))  // the trial's window starts
        var kept: (action: ConnectionTuner.Action?, then: RunState.Tuned?) = (nil, nil)
        for t in stride(from: 0.25, through: 0.45, by: 0.05) where kept.then == nil {
            kept = s.tunerSampled(sample(t), trialBytes: Int64(4000 * (t - 0.2)), writers: writers(s))
        }
        #expect(kept.action == .keepShed && kept.then == .keptShed(from: 4))
        #expect(s.connections == .shed(keeper: keeper) && !s.tuning)
        let cut = (0..<4).filter { $0 != 3 }.allSatisfy { i in
            s.scheduler.map { $0.segments[i].done > 0 && $0.segments[i].end == $0.segments[i].start + $0.segments[i].done } ?? false
        }
        #expect(cut && s.scheduler?.segments.count == 7, "the held ranges end where their writers are, the rest unowned")
        let after = s.tunerSampled(sample(1), trialBytes: 4000, writers: writers(s))
        #expect(after.action == nil && after.then == nil, "decided once")

        // One connection clearly slower: the others come back, before the whole window.
        var r = running(4)
        guard trial(&r) != nil else { return }
        _ = r.tunerSampled(sample(0.2), trialBytes: 0, writers: writers(r))
        var back: (action: ConnectionTuner.Action?, then: RunState.Tuned?) = (nil, nil)
        for t in stride(from: 0.25, through: 0.45, by: 0.05) where back.then == nil {
            back = r.tunerSampled(sample(t), trialBytes: Int64(40 * (t - 0.2)), writers: writers(r))
        }
        #expect(back.action == .restore && back.then == .restored && r.connections == .all && !r.tuning)
    }

    /// The search for a source whose bytes break the whole-file hash, with no file to hash: the
    /// bytes of unknown source first, then each source's share in turn, the largest first, that
    /// source suspended meanwhile; a match names the one suspended last, and the finish need not
    /// hash the file again.
    @Test func theSearchForABadSourceSuspectsTheLargestShareFirstAndNamesIt() {
        let strong = Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        var s = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                         sources: SourceSet(urls: ["http://a/f", "http://b/f", "http://c/f"], connections: 2))
        s.newRound(connections: 2)
        _ = s.partialResponse(segment: 0, at: 0, total: 1000, validators: strong, source: 0, digest: nil, connections: 2)
        func spans(_ r: [(start: Int64, end: Int64)]?) -> [[Int64]] { (r ?? []).map { [$0.start, $0.end] } }
        func suspended(_ i: Int) -> Bool { s.sources.sources[i].retired == SourceSet.suspected }
        s.wrote(0, 500, by: 1)
        s.wrote(500, 800, by: 0)  // (800..<1000: written before a kill, by no known source)

        let first = s.hashFailed(algorithm: "sha-256")
        #expect(first?.source == -1 && spans(first?.ranges) == [[800, 1000]], "the bytes of unknown source first")
        #expect(first?.notice.contains("sha-256 hash; fetching again the 200 B whose source is not known") == true, "\(first?.notice ?? "")")
        s.wrote(800, 1000, by: 2)
        let second = s.hashFailed(algorithm: "sha-256")
        #expect(second?.source == 1 && spans(second?.ranges) == [[0, 500]] && suspended(1), "then the largest share")
        #expect(second?.notice.hasSuffix("fetching the 500 B that http://b/f sent from the other sources") == true, "\(second?.notice ?? "")")
        s.wrote(0, 500, by: 0)  // its share, from the others
        let third = s.hashFailed(algorithm: "sha-256")
        #expect(third?.source == 0 && spans(third?.ranges) == [[0, 800]] && suspended(0) && !suspended(1))
        s.wrote(0, 800, by: 1)
        let fourth = s.hashFailed(algorithm: "sha-256")
        #expect(fourth?.source == 2 && spans(fourth?.ranges) == [[800, 1000]] && suspended(2))
        let preVerifiedBefore = s.preVerified
        #expect(preVerifiedBefore == nil)

        // The hash matches with source 2's share fetched from the others: source 2 is named.
        let digest = ExpectedDigest(source: "--checksum", algorithm: .sha256, bytes: Array(repeating: 7, count: 32))
        let notice = s.hashMatched(digest)
        #expect(notice?.contains("c/f") == true && s.sources.isRetired(2) && !suspended(2), "\(notice ?? "no notice")")
        #expect(s.preVerified == digest && s.search == nil)
        // Every source suspected once, none left: a new failure starts a new search.
        let again = s.hashFailed(algorithm: "sha-256")
        #expect(again?.source == 1, "a new search")
    }

    /// The target is named outside the lock: the first name recorded stays, unless a finished
    /// file's check names it anew.
    @Test func theFirstNameOfTheTargetStays() {
        var s = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100)
        s.named("/d/f", replacing: false)
        s.named("/d/f (1)", replacing: false)
        #expect(s.record.target == "/d/f")
        s.named("/d/g", replacing: true)
        #expect(s.record.target == "/d/g")
    }

    /// A range's 206 before its body, as one event with no server: the round's first answer
    /// learns the file, names its mirrors, decides on more connections and starts the tuner; a
    /// dropped writer, a retired source and a disagreeing answer stop before anything changes.
    @Test func aRangesAnswerIsDecidedBeforeItsBody() {
        let strong = Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        let weak = Validators(etag: EntityTag("W/\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        func answer(_ s: inout RunState, source: Int = 0, total: Int64 = 100_000, validators: Validators? = nil,
                    cursor: SegmentCursor? = nil, mirrors: [String] = []) -> RunState.RangeAnswered {
            let c = cursor ?? s.cursor(0, start: 0, position: 0, end: nil)
            if cursor == nil { s.writes(c) }
            var a = RunState.RangeAnswer(cursor: c, at: 0, end: nil, total: total, validators: validators ?? strong, source: source,
                                         connection: 0, digest: nil, latency: 0.01, mirrors: mirrors, connections: 4)
            a.tuner = ConnectionTuner(threads: 2)
            a.sample = .init(time: 1, cpu: 0, bytes: 0, connections: 0)
            return s.rangeAnswered(a)
        }

        // The first answer of the URL given: the file, its mirror, four ranges, the tuner.
        var s = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100)
        s.newRound(connections: 4)
        guard case .write(let w) = answer(&s, mirrors: ["http://m/f"]) else {
            Issue.record("not written")
            return
        }
        #expect(w.decided && w.openMore && w.preallocate == 100_000 && w.described && w.nameTarget && w.tuning)
        #expect(s.record.totalLength == 100_000 && s.record.validators == strong && s.scheduler?.segments.count == 4)
        #expect(s.sources.sources.map(\.url) == ["http://a/f", "http://m/f"], "the mirror the head names")
        #expect(s.tuning && w.cursor.end.load(ordering: .relaxed) == 25_000, "its writer ends where its range does")
        // A later answer decides nothing again.
        guard case .write(let later) = answer(&s, cursor: w.cursor, mirrors: ["http://n/f"]) else {
            Issue.record("not written")
            return
        }
        #expect(!later.decided && !later.openMore && !later.described && !later.nameTarget && !later.tuning)
        // A writer whose answer is being decided, not registered yet: its end is its range's too.
        let pending = s.cursor(1, start: 25_000, position: 25_000, end: nil)
        let pendingAnswer = RunState.RangeAnswer(cursor: pending, at: 25_000, end: nil, total: 100_000, validators: strong, source: 0,
                                                 connection: 1, digest: nil, latency: 0.01, mirrors: [], connections: 4)
        if case .write = s.rangeAnswered(pendingAnswer) {} else { Issue.record("a later range's answer not written") }
        #expect(pending.end.load(ordering: .relaxed) == 50_000, "an unregistered writer's end is lowered to its range's")
        #expect(s.responses[1]?.cursor === pending && s.responses[1]?.from == 25_000, "its response is in flight from where it writes")
        #expect(s.sources.sources.count == 2, "mirrors are taken from the first answer only")

        // A weak validator (and no mirror): one connection, no tuner.
        var one = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100)
        one.newRound(connections: 4)
        guard case .write(let alone) = answer(&one, validators: weak) else {
            Issue.record("not written")
            return
        }
        #expect(alone.decided && !alone.openMore && !alone.tuning && one.scheduler?.segments.count == 1)

        // Stops: a writer dropped for a whole response, a retired source, a length that is not the file's.
        var dropped = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100)
        dropped.fetchAlone(1)
        let stale = dropped.cursor(0, start: 0, position: 0, end: nil)
        if case .stop(.nothingToRead) = answer(&dropped, cursor: stale) {} else { Issue.record("a dropped writer wrote") }
        #expect(dropped.record.totalLength == nil, "nothing learnt from it")
        var several = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                               sources: SourceSet(urls: ["http://a/f", "http://b/f"], connections: 2))
        several.newRound(connections: 2)
        _ = answer(&several)
        let other = answer(&several, source: 1, total: 99_999)
        if case .stop(.rejected(let why, _)) = other { #expect(why.contains("99999")) } else { Issue.record("\(other)") }
        var unproven = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                                sources: SourceSet(urls: ["http://a/f", "http://b/f"], connections: 2))
        unproven.describe { $0.totalLength = 100_000 }
        let changed = answer(&unproven, source: 1, total: 99_999)
        if case .changed = changed {} else { Issue.record("no other source answered, yet \(changed)") }
        _ = several.reject(1, why: "gone")
        let retired = answer(&several, source: 1)
        if case .stop(.rejected("it was retired", _)) = retired {} else { Issue.record("\(retired)") }
    }

    /// A whole response (a 200) to a range request, decided with no server: alone from the start
    /// it simply replaces; while other ranges run they stop first, and the notice says why the
    /// server may have done so; a writer dropped for another 200 is stale; a mirror that does not
    /// take ranges leaves while others are live; once taken, one range from byte 0 is its own.
    @Test func aWholeAnswerToARangeRequestReplacesTheHeldBytesOrStops() {
        let strong = Validators(etag: EntityTag("\"x\""), lastModified: nil, lastModifiedIsStrong: false)
        let other = Validators(etag: EntityTag("\"y\""), lastModified: nil, lastModifiedIsStrong: false)
        var one = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100)
        let first = one.cursor(0, start: 0, position: 0, end: nil)
        one.writes(first)
        #expect(one.wholeAnswered(cursor: first, source: 0, offset: 0, validators: strong) == .replace(othersRunning: false, why: nil))

        var s = Self.running(4)  // four ranges of 100,000 bytes, validator "x"
        func writer(_ i: Int) -> SegmentCursor {
            let seg = s.scheduler!.segments[i]
            let c = s.cursor(i, start: seg.start, position: seg.start, end: seg.end)
            s.writes(c)
            return c
        }
        let third = writer(2)
        guard case .replace(true, let same?) = s.wholeAnswered(cursor: third, source: 0, offset: 50_000, validators: strong),
            case .replace(true, let balanced?) = s.wholeAnswered(cursor: third, source: 0, offset: 50_000, validators: other)
        else {
            Issue.record("not a replacement while others run")
            return
        }
        #expect(same.contains("did not take the range") && balanced.contains("load balancer"))
        let second = writer(1)
        let others = s.writeAlone(keeping: third, connection: 2)
        #expect(others?.contains { $0 === second } == true && second.end.load(ordering: .relaxed) == second.position.load(ordering: .relaxed))
        #expect(s.wholeAnswered(cursor: second, source: 0, offset: 25_000, validators: other) == .stop(.nothingToRead), "stale")
        _ = s.restarted { r in
            r.totalLength = 100_000
            r.segments = [SegmentRecord(start: 0, end: 100_000, done: 0)]
        }
        let fresh = s.wholeTaken(total: 100_000, by: 2, source: 0, latency: 0.01)
        #expect(fresh.start == 0 && fresh.end.load(ordering: .relaxed) == 100_000 && s.cursors[0] === fresh)
        // The response is in flight from its first byte, from the source that sent it.
        #expect(s.responses[2]?.cursor === fresh && s.responses[2]?.from == 0 && s.responses[2]?.source == 0)
        #expect(s.scheduler?.segments.count == 1 && s.scheduler?.segments[0].owner == 2)

        // A mirror that sends the whole file while the URL given has answered: it leaves.
        var mirrors = RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                               sources: SourceSet(urls: ["http://a/f", "http://b/f"], connections: 2))
        mirrors.newRound(connections: 2)
        _ = mirrors.partialResponse(segment: 0, at: 0, total: 100_000, validators: strong, source: 0, digest: nil, connections: 2)
        let m = mirrors.cursor(1, start: 50_000, position: 50_000, end: 100_000)
        let refused = mirrors.wholeAnswered(cursor: m, source: 1, offset: 50_000, validators: strong)
        #expect(refused == .stop(.rejected(reason: "it sent the whole file (200) to a range request", otherFile: false)))
    }

    /// A connection starts at the source a finished file's validators are from (its check is
    /// made there), else at the URL given; a retired one is not asked, and the check is not made
    /// on that connection.
    @Test func aConnectionStartsWhereTheFinishedFileWasChecked() {
        func run() -> RunState {
            RunState(record: ControlRecord.empty(url: "http://a/f"), minSplit: 100,
                     sources: SourceSet(urls: ["http://a/f", "http://b/f"], connections: 2))
        }
        var s = run()
        let atMirror = s.connectionStarts(0, finishedAt: "http://b/f")
        #expect(atMirror?.source == 1 && atMirror?.asked == true)
        let given = s.connectionStarts(1, finishedAt: nil)
        #expect(given?.source == 0 && given?.asked == true)
        var r = run()
        r.newRound(connections: 2)
        _ = r.partialResponse(segment: 0, at: 0, total: 1000, validators: Validators(etag: EntityTag("\"x\""), lastModified: nil,
                                                                                    lastModifiedIsStrong: false), digest: nil, connections: 2)
        _ = r.reject(1, why: "gone")
        let elsewhere = r.connectionStarts(0, finishedAt: "http://b/f")
        #expect(elsewhere?.source == 0 && elsewhere?.asked == false, "a retired source is not asked, nor is the check made")
    }
}
