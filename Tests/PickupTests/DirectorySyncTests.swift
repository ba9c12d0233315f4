import Foundation
import Testing

@testable import Pickup

/// Directory fsyncs shared by the downloads finishing in one directory: each caller returns only
/// after an fsync that started after it arrived has ended, and callers that arrive together share.
@Suite struct DirectorySyncTests {
    /// What happened, in one order: arrivals, syncs' starts and ends, returns.
    final class Log: @unchecked Sendable {
        enum Event { case arrive(Int, key: Int), start(key: Int), end(key: Int), leave(Int) }
        private let lock = NSLock()
        private(set) var events: [Event] = []
        func add(_ e: Event) { lock.withLock { events.append(e) } }
    }

    static func key(_ n: Int) -> DirectorySync.Key { DirectorySync.Key(device: 1, inode: UInt64(n), barrier: false) }

    /// Runs `bodies` on threads of their own and returns when all have ended (no cooperative
    /// thread waits).
    static func onThreads(_ bodies: [@Sendable () -> Void]) async {
        final class Left: @unchecked Sendable {
            let lock = NSLock()
            var count: Int
            init(_ count: Int) { self.count = count }
            func one() -> Bool { lock.withLock { count -= 1; return count == 0 } }
        }
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let left = Left(bodies.count)
            for body in bodies { Thread { body(); if left.one() { done.resume() } }.start() }
        }
    }

    @Test func everyCallerIsCoveredByASyncThatStartedAfterItArrived() async {
        var rng = SplitMix(state: propertySeed("PICKUP_DIRSYNC_SEED", "everyCallerIsCoveredByASyncThatStartedAfterItArrived"))
        for _ in 0..<40 {
            let log = Log()
            let spin = UInt64.random(in: 0...200, using: &rng)
            let syncs = DirectorySync { fd, _ in
                log.add(.start(key: Int(fd)))
                for _ in 0..<spin { sched_yield() }
                log.add(.end(key: Int(fd)))
            }
            let callers = Int.random(in: 1...24, using: &rng)
            let keys = Int.random(in: 1...3, using: &rng)
            let plan = (0..<callers).map { _ in (Int.random(in: 0..<keys, using: &rng), UInt64.random(in: 0...300, using: &rng)) }
            await Self.onThreads(plan.enumerated().map { i, step in
                { @Sendable in
                    for _ in 0..<step.1 { sched_yield() }
                    log.add(.arrive(i, key: step.0))
                    syncs.sync(Int32(step.0), key: Self.key(step.0))
                    log.add(.leave(i))
                }
            })
            let events = log.events
            var running: [Int: Bool] = [:]
            for (position, event) in events.enumerated() {
                switch event {
                case .start(let key):
                    #expect(running[key] != true, "two syncs of one directory at once")
                    running[key] = true
                case .end(let key): running[key] = false
                case .arrive(let caller, let key):
                    // A sync of this directory must start after the arrival and end before the leave.
                    let leave = events.firstIndex { if case .leave(caller) = $0 { return true } else { return false } }!
                    let starts = events[position..<leave].indices.filter { if case .start(key) = events[$0] { return true } else { return false } }
                    let covered = starts.contains { s in
                        events[s..<leave].contains { if case .end(key) = $0 { return true } else { return false } }
                    }
                    #expect(covered, "caller \(caller) returned without a sync of its directory that started after it arrived")
                case .leave: break
                }
            }
        }
    }

    @Test func callersThatArriveDuringASyncShareTheNextOne() async {
        let count = 16
        final class State: @unchecked Sendable {
            let lock = NSLock()
            var performed = 0
            var syncs: DirectorySync?
        }
        let state = State()
        let syncs = DirectorySync { _, _ in
            let n = state.lock.withLock { state.performed += 1; return state.performed }
            // The first sync lasts until every caller is inside (bounded): all but its own caller
            // then need the next one, and share it.
            if n == 1, let syncs = state.lock.withLock({ state.syncs }) {
                var spins = 0
                while syncs.callers(Self.key(7)) < count, spins < 50_000_000 { sched_yield(); spins += 1 }
            }
        }
        state.lock.withLock { state.syncs = syncs }
        await Self.onThreads((0..<count).map { _ in { @Sendable in syncs.sync(7, key: Self.key(7)) } })
        let performed = state.lock.withLock { state.performed }
        #expect(performed == 2, "\(count) callers arriving during one sync should share one more, not \(performed - 1)")
        #expect(syncs.callers(Self.key(7)) == 0)
    }
}
