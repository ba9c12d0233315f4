import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup
import PickupBackground

/// Background transfers under SIGKILL: an app gone to the background (`pickup-handoff-probe`, a
/// process that opens the manager, hands its waiting download to background transfers in small
/// chunks and waits for them to land) is killed at random moments, again and again: while tasks
/// fetch, while a chunk is copied into the partial file, between its fsync and the record. After
/// every kill the control file claims only bytes that are the file's own (never a byte of no
/// version, never an unwritten one); a last probe runs to its end, and the foreground then
/// finishes byte-exact, fetching again at most what was in flight at each kill.
///
/// Seeded: `PICKUP_HANDOFF_KILL_SEED` replays a run (its seed is printed); 3 trials, 12 under
/// `PICKUP_TORTURE=1`.
@Suite(.serialized, .timeLimit(.minutes(10)),
       .enabled(if: CLI.product("pickup-handoff-probe") != nil, "pickup-handoff-probe is not built (swift build)"))
struct HandOffCrashTests {
    @Test func killedWhileChunksLandNothingButTheFilesOwnBytesIsClaimed() async throws {
        let env = ProcessInfo.processInfo.environment
        let seed = env["PICKUP_HANDOFF_KILL_SEED"].flatMap { UInt64($0) } ?? UInt64.random(in: 1...UInt64(UInt32.max))
        let trials = env["PICKUP_TORTURE"] == "1" ? 12 : 3
        print("hand-off crash test: seed \(seed), \(trials) trials (replay with PICKUP_HANDOFF_KILL_SEED=\(seed))")
        var random = SplitMix(state: seed)
        var kills = 0, refetched = 0, landed = 0
        for trial in 0..<trials {
            let label = "trial \(trial) of seed \(seed)"
            let size = 600_000 + Int(random.next() % 1_400_000)
            let chunk = (64 << 10) * (1 + Int(random.next() % 3))
            let runs = 1 + Int(random.next() % 4)
            let moments = (0..<runs).map { _ in Int(random.next() % UInt64(size)) }
            let early = (0..<runs).map { _ in random.next() % 4 == 0 }
            let (k, again, written) = try await Self.trial(size: size, chunk: chunk, moments: moments, early: early, label: label)
            kills += k
            refetched += again
            landed += written
        }
        print("hand-off crash test: seed \(seed): \(kills) kills, \(landed) bytes landed by background transfers, \(refetched) fetched twice in all")
        #expect(landed > 0, "no chunk landed: the hand-off was not tested")
    }

    /// One download: a foreground run stopped part-way, `moments.count` probes killed once the
    /// server has sent them that many bytes (or in their first milliseconds, where `early`), a
    /// last probe to its end, then the foreground. Returns the kills, the bytes fetched twice and
    /// the bytes the probes landed.
    static func trial(size: Int, chunk: Int, moments: [Int], early: [Bool], label: String) async throws
        -> (kills: Int, refetched: Int, landed: Int)
    {
        try await ManagerFixture().run { f in
            let path = "/f/0.bin"
            let body = f.serveFiles(1, size: size, rate: 300_000, stallAfter: 100_000)[0]
            let url = f.server.url(path)
            let m = try f.manager(stall: 600)
            let id = try await m.add(url, to: .directory(f.dir.path))
            await m.waitUntil { ($0[id]?.progress.bytesDone ?? 0) > 50_000 }
            await m.shutdown()
            // (Slow enough that landings, one at a time with their fsyncs, keep up on loaded cores.)
            f.server.update(path) { $0.bytesPerSecond = 400_000; $0.faults = [] }
            let tmp = TempDir()
            let probe = try #require(CLI.product("pickup-handoff-probe"))
            let command = [probe, f.state.path.string, String(chunk)]
            var kills = 0
            // Each probe run's requests (by index) and the bytes it landed.
            var probeRuns: [(first: Int, end: Int, landed: Int)] = []
            for run in 0...moments.count {
                let last = run == moments.count
                let before = f.server.requests(path).count
                let heldBefore = (try? BackgroundTests.held(url, in: f.dir.path).0.durableBytes) ?? 0
                let filesBefore = tmp.entries.count
                let killed: Bool
                do {
                    let p = try await CLI.start([], state: f.state.path, environment: ["TMPDIR": tmp.path.string], through: { _ in command })
                    defer { p.kill() }
                    if !last {
                        let began = Date()
                        let server = f.server, isEarly = early[run], moment = moments[run] % max(1, size - Int(heldBefore))
                        let sent: @Sendable () -> Int = { server.requests(path).dropFirst(before).reduce(0) { $0 + $1.bytesSent } }
                        // Killed on the polling thread the moment it is seen.
                        _ = await eventually(seconds: 120, {
                            !p.isRunning || (isEarly ? Date().timeIntervalSince(began) >= 0.005 : sent() >= moment)
                        }, then: { _ in p.signal(SIGKILL) })
                    }
                    let ended = await eventually(seconds: 120) { !p.isRunning }
                    #expect(ended, "\(label): probe run \(run) hung")
                    if !ended { p.signal(SIGKILL) }
                    let status = await p.wait()
                    let byKill = status == .signalled(SIGKILL)
                    #expect(byKill || status == .exited(0), "\(label): probe run \(run) ended: \(status)")
                    killed = byKill
                }
                if killed { kills += 1 }
                if !killed {
                    // (A killed run leaves its tasks' files: the session's, not ours.)
                    #expect(tmp.entries.count <= filesBefore, "\(label): the session's files of the chunks that landed are left in TMPDIR: \(tmp.entries)")
                }
                let (record, partial) = try BackgroundTests.held(url, in: f.dir.path)
                probeRuns.append((before, f.server.requests(path).count, Int(record.durableBytes - heldBefore)))
                // The invariant: every byte the record claims is the file's own, in its place.
                for r in HandOff.held(record.segments) {
                    let ok = r.end <= Int64(partial.count) && partial[Int(r.start)..<Int(r.end)].elementsEqual(body[Int(r.start)..<Int(r.end)])
                    #expect(ok, "\(label): after probe run \(run) the record claims \(r.start)..<\(r.end), which is not the file's")
                }
            }
            let fg = try f.manager()
            #expect(await fg.outcome(of: id)?.state == .completed, "\(label)")
            let same = f.dir.read("0.bin") == body
            #expect(same, "\(label): the file is not byte-exact")
            // Fetched twice: what each probe run had asked for and not written (its tasks at the
            // kill, and chunks landed and not yet written), and what the first foreground run was
            // sent and had not read when it stopped. The last foreground fetches what is missing.
            let refetched = f.server.bytesSent(path) - size
            // (Counted at the end: a server goes on writing into a killed run's sockets a moment.)
            let requests = f.server.requests(path)
            let lost = probeRuns.map { r in max(0, requests[r.first..<r.end].reduce(0) { $0 + $1.bytesSent } - r.landed) }
            let inFlight = lost.reduce(0, +)
            // A kill costs whole chunks: those its session had going (`chunksAtOnce` per host) and
            // those fetched but not yet written (landings are written one at a time, each with its
            // fsyncs: how many wait depends on the disk and the load, 16 of 64 KiB on loaded CI
            // cores). So: no answer larger than its chunk, and nothing lost beyond the chunks
            // asked for and not written.
            for (run, r) in probeRuns.enumerated() {
                let asked = requests[r.first..<r.end]
                #expect(asked.allSatisfy { $0.bytesSent <= chunk }, "\(label): probe run \(run) was sent more than a chunk for one")
                let unwritten = max(0, asked.count - r.landed / chunk)
                #expect(lost[run] <= unwritten * chunk,
                        "\(label): probe run \(run) lost \(lost[run]) bytes, more than its \(unwritten) chunks of \(chunk) not written")
            }
            #expect(refetched <= inFlight + (128 << 10), "\(label): \(refetched) bytes fetched twice, \(inFlight) in flight at the kills")
            return (kills, refetched, probeRuns.reduce(0) { $0 + $1.landed })
        }
    }
}
