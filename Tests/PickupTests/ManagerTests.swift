import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// A manager on the test server: its own state and download directories, test engine settings.
final class ManagerFixture: TestFixture, @unchecked Sendable {
    let server: TestServer
    let dir = TempDir()
    let state = TempDir()
    /// The managers ``manager(limit:autoStart:order:)`` made: shut down by ``close()``.
    private let lock = NSLock()
    private var managers: [DownloadManager] = []

    init() async throws { server = try await TestServer.start() }

    func configuration(limit: Int = 2, autoStart: Bool = true, order: QueueOrder = .fifo, stall: Double = 0.5) -> DownloadManager.Configuration {
        var c = DownloadManager.Configuration(stateDirectory: state.path)
        c.maxConcurrentDownloads = limit
        c.autoStart = autoStart
        c.order = order
        c.progressInterval = 0.02
        c.engine = testOptions(state: state.path)
        c.transport = testTransport(stall: stall)
        return c
    }

    func manager(limit: Int = 2, autoStart: Bool = true, order: QueueOrder = .fifo, stall: Double = 0.5) throws -> DownloadManager {
        let m = try DownloadManager(configuration: configuration(limit: limit, autoStart: autoStart, order: order, stall: stall))
        lock.withLock { managers.append(m) }
        return m
    }

    /// Serves `count` files `/f/0.bin`... of `size` bytes each (seeded by index), at `rate` bytes/s.
    /// With `stallAfter`, each file's first answer sends that many bytes and then nothing (with
    /// ``manager(stall:)`` long, a download that cannot finish before the test acts on it,
    /// however loaded the machine; a rate alone did not hold on two loaded cores).
    func serveFiles(_ count: Int, size: Int, rate: Int? = nil, stallAfter: Int? = nil) -> [[UInt8]] {
        (0..<count).map { i in
            let body = Resource.bytes(count: size, seed: UInt64(i + 1))
            server.set("/f/\(i).bin", Resource(body: body, faults: stallAfter.map { [.stallAfter($0)] } ?? [], bytesPerSecond: rate))
            return body
        }
    }

    /// Shuts down every manager it made (a test that ended early leaves none downloading), then
    /// the server.
    func close() async {
        for m in lock.withLock({ managers }) { await m.shutdown() }
        await server.stop()
    }
}

extension DownloadManager {
    /// Follows the events until `condition` holds for the downloads as they are (the snapshot
    /// first, so a condition already true returns at once). Returns the view at that moment.
    @discardableResult
    func waitUntil(sourceLocation: SourceLocation = #_sourceLocation,
                   _ condition: @Sendable ([DownloadID: DownloadInfo]) -> Bool) async -> [DownloadID: DownloadInfo] {
        var view: [DownloadID: DownloadInfo] = [:]
        for await e in events() {
            switch e {
            case .snapshot(let all, _): for i in all { view[i.id] = i }
            case .added(let i), .changed(let i): view[i.id] = i
            case .progress(let id, let p): view[id]?.progress = p
            case .removed(let id): view[id] = nil
            case .totals, .notice: break
            }
            if condition(view) { return view }
        }
        let states = view.values.sorted { $0.id < $1.id }.map { "\($0.id) \($0.state) \($0.progress.bytesDone) \($0.failure?.reason ?? "")" }
        Issue.record("events ended before the condition held: \(states)", sourceLocation: sourceLocation)
        return view
    }

    /// Waits until every download is completed or failed, and expects them all in `state`.
    func waitUntilAll(_ state: DownloadState, sourceLocation: SourceLocation = #_sourceLocation) async {
        let view = await waitUntil(sourceLocation: sourceLocation) { v in !v.isEmpty && v.values.allSatisfy { $0.state == state || $0.state == .failed } }
        for info in view.values where info.state != state {
            Issue.record("\(info.url) is \(info.state): \(info.failure?.reason ?? "")", sourceLocation: sourceLocation)
        }
    }
}

@Suite(.timeLimit(.minutes(3))) struct ManagerTests {
    /// At the lowest speed limit a paused download stops transferring, and the manager shuts down,
    /// without waiting for the limiter's pause to run out (a minute or more per read here; the
    /// suite's time limit is the guard).
    @Test func pauseAndShutdownTakeEffectAtTheLowestLimit() async throws {
        try await ManagerFixture().run { f in
            _ = f.serveFiles(1, size: 1 << 20)
            let m = try f.manager()
            let id = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path), speedLimit: RateLimiter.minimum)
            await m.waitUntil { $0[id]?.progress.bytesDone ?? 0 > 0 }
            try await m.pause(id)
            let paused = await m.waitUntil { $0[id]?.state == .paused }
            #expect(paused[id]?.progress.bytesDone ?? 0 < 1 << 20, "the limit held until the pause")
            try await m.resume(id)
            await m.waitUntil { $0[id]?.state == .running }
            await m.shutdown()
        }
    }

    @Test func neverMoreThanTheLimitAtOnceAndEveryFileByteExact() async throws {
        try await ManagerFixture().run { f in
            let bodies = f.serveFiles(8, size: 200_000, rate: 2_000_000)
            let m = try f.manager(limit: 3)
            var ids: [DownloadID] = []
            for i in bodies.indices { ids.append(try await m.add(f.server.url("/f/\(i).bin"), to: .directory(f.dir.path))) }
            await m.waitUntilAll(.completed)
            #expect(f.server.peakConcurrentTransfers <= 3)
            #expect(f.server.peakConcurrentTransfers >= 1)
            for (i, body) in bodies.enumerated() { #expect(f.dir.read("\(i).bin") == body) }
            let totals = await m.totals()
            #expect(totals.count(.completed) == 8)
            #expect(totals.bytesDone == 8 * 200_000)
            #expect(totals.fraction == 1)
            let info = await m.download(ids[2])
            #expect(info?.path == f.dir.file("2.bin"))
            #expect(await m.isDownloaded(f.server.url("/f/2.bin")))
            await m.shutdown()
        }
    }

    @Test(arguments: [QueueOrder.fifo, .lifo])
    func priorityThenOrderDecideWhatStartsFirst(order: QueueOrder) async throws {
        try await ManagerFixture().run { f in
            _ = f.serveFiles(4, size: 10_000)
            let m = try f.manager(limit: 1, autoStart: false, order: order)
            for (i, p) in [0, 0, 5, 0].enumerated() {
                try await m.add(f.server.url("/f/\(i).bin"), to: .directory(f.dir.path), priority: p)
            }
            let fourth = try #require(await m.downloads(url: f.server.url("/f/3.bin")).first?.id)
            try await m.moveToFront(fourth)
            let (events, done) = AsyncStream<String>.makeStream()
            let watcher = Task {
                for await e in await m.events() {
                    if case .changed(let info) = e, info.state == .completed {
                        done.yield(info.path?.lastComponent?.string ?? "")
                    }
                }
            }
            await m.start()
            var finished: [String] = []
            for await name in events {
                finished.append(name)
                if finished.count == 4 { break }
            }
            let expected = order == .fifo ? ["3.bin", "2.bin", "0.bin", "1.bin"] : ["3.bin", "2.bin", "1.bin", "0.bin"]
            #expect(finished == expected)
            watcher.cancel()
            await m.shutdown()
        }
    }

    @Test func pauseAndResumeWhileRunningFetchNothingTwice() async throws {
        try await ManagerFixture().run { f in
            // It cannot finish before the pause lands: its first answer stops a third of the way,
            // paced, so what the server sent is what the client read (not a socket buffer's worth).
            let body = f.serveFiles(1, size: 3_000_000, rate: 400_000, stallAfter: 1_000_000)[0]
            let m = try f.manager(stall: 600)
            let id = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            await m.waitUntil { ($0[id]?.progress.bytesDone ?? 0) > 300_000 }
            try await m.pause(id)
            #expect(await m.download(id)?.state == .paused)
            await m.waitUntil { $0[id]?.state == .paused }
            f.server.update("/f/0.bin") { $0.bytesPerSecond = nil }
            #expect(await m.downloads(in: .paused).map(\.id) == [id])
            try await m.resume(id)
            await m.waitUntilAll(.completed)
            #expect(f.dir.read("0.bin") == body)
            let requests = f.server.requests("/f/0.bin")
            try #require(requests.count == 2)
            #expect(requests[1].headers["if-range"] == "\"v1\"")
            // The pause checkpointed everything written, so the resumed request starts at or after
            // the progress seen before pausing.
            let resumedAt = Int(requests[1].headers["range"]!.dropFirst(6).split(separator: "-")[0])!
            #expect(resumedAt > 300_000)
            #expect(f.server.bytesSent("/f/0.bin") < body.count + 200_000)
            await m.shutdown()
        }
    }

    @Test func cancelWhileRunningDeletesThePartialOrKeepsItWhenAsked() async throws {
        for keep in [false, true] {
            try await ManagerFixture().run { f in
                _ = f.serveFiles(1, size: 3_000_000, stallAfter: 1_000_000)
                let m = try f.manager(stall: 600)
                let id = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
                await m.waitUntil { ($0[id]?.progress.bytesDone ?? 0) > 200_000 }
                try await m.cancel(id, deletePartial: !keep)
                #expect(await m.download(id) == nil)
                await m.shutdown()  // waits for the transfer to end
                #expect(f.dir.entries.contains { $0.hasSuffix(".pickup-part") } == keep)
                #expect(!f.dir.entries.contains("0.bin"))
                // A new manager does not bring it back.
                let again = try f.manager()
                #expect(await again.downloads().isEmpty)
                await again.shutdown()
            }
        }
    }

    /// Removed while running (its partial file to be deleted) and added again at once: the new
    /// download waits until the old transfer has ended and its deletion is done, then completes
    /// byte-exact (never running beside it, nor losing its bytes to that deletion).
    @Test func aDownloadRemovedWhileRunningAndAddedAgainStartsAfterTheOldOneEnds() async throws {
        try await ManagerFixture().run { f in
            let bodies = f.serveFiles(1, size: 3_000_000, stallAfter: 1_000_000)
            let m = try f.manager(stall: 600)
            let old = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            await m.waitUntil { ($0[old]?.progress.bytesDone ?? 0) > 200_000 }
            try await m.remove(old, deleteFile: false, deletePartial: true)
            let again = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            #expect(again != old)
            let view = await m.waitUntil { $0[again]?.state.isFinal == true }
            #expect(view[again]?.state == .completed, "\(String(describing: view[again]?.failure))")
            #expect(f.dir.read("0.bin") == bodies[0])
            #expect(!f.dir.entries.contains { $0.hasSuffix(".pickup-part") })
            await m.shutdown()
        }
    }

    @Test func restartingTheManagerMidDownloadResumesItAndPausedOnesStayPaused() async throws {
        try await ManagerFixture().run { f in
            // The first answer sends a third of the file and then nothing: it cannot finish before
            // the shutdown (with a rate limit instead, CI once saw the whole file arrive first).
            // Paced, so what the server sent is what the client read (not a socket buffer's worth).
            let bodies = f.serveFiles(2, size: 3_000_000, rate: 400_000, stallAfter: 1_000_000)
            let first = try f.manager(stall: 600)
            let running = try await first.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            let paused = try await first.add(f.server.url("/f/1.bin"), to: .directory(f.dir.path), paused: true)
            await first.waitUntil { ($0[running]?.progress.bytesDone ?? 0) > 400_000 }
            // A second manager on the same state directory is refused while the first one lives.
            #expect(throws: PickupError.self) { try f.manager() }
            await first.shutdown()
            f.server.update("/f/0.bin") { $0.bytesPerSecond = nil }

            let second = try f.manager()
            let restored = await second.download(paused)
            #expect(restored?.state == .paused)
            let resumed = await second.download(running)
            #expect((resumed?.progress.bytesDone ?? 0) > 0)  // progress comes back from the control file
            await second.waitUntil { $0[running]?.state == .completed }
            #expect(f.dir.read("0.bin") == bodies[0])
            #expect(f.server.requests("/f/1.bin").isEmpty)  // the paused one did not auto-resume
            #expect(f.server.requests("/f/0.bin").count == 2)
            #expect(f.server.bytesSent("/f/0.bin") < bodies[0].count + 200_000)
            await second.shutdown()
        }
    }

    /// An observer that stops reading is cut off once it is `backlog` events behind, rather than
    /// growing the manager's memory; it never sees a gap, and a new observation starts afresh.
    @Test func aStalledObserverIsEndedNotLeftToGrow() async throws {
        try await ManagerFixture().run { f in
            let m = try f.manager(autoStart: false)
            let stalled = await m.events(backlog: 3)
            for i in 0..<5 { try await m.add(f.server.url("/x/\(i).bin"), to: .directory(f.dir.path), paused: true) }
            var seen: [String] = []
            for await e in stalled {
                switch e {
                case .snapshot: seen.append("snapshot")
                case .added(let info): seen.append("added \(info.id)")
                default: seen.append("other")
                }
            }
            // The snapshot and the first two additions, in order, then the end.
            #expect(seen == ["snapshot", "added 1", "added 2"])
            var fresh = await m.events().makeAsyncIterator()
            guard case .snapshot(let all, _)? = await fresh.next() else { Issue.record("no snapshot"); return }
            #expect(all.count == 5)
            await m.shutdown()
        }
    }

    @Test func sameURLAndDestinationIsOneDownload() async throws {
        try await ManagerFixture().run { f in
            let body = f.serveFiles(1, size: 50_000)[0]
            let m = try f.manager()
            let a = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            let b = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            #expect(a == b)
            let other = try await m.add(f.server.url("/f/0.bin"), to: .file(f.dir.file("copy.bin")))
            #expect(other != a)
            await m.waitUntilAll(.completed)
            #expect(f.dir.read("copy.bin") == body)
            // The user deletes the file: it is no longer downloaded, and adding it again fetches it again.
            try FileManager.default.removeItem(atPath: f.dir.file("0.bin").string)
            #expect(await m.isDownloaded(f.server.url("/f/0.bin")))  // the copy is still there
            try FileManager.default.removeItem(atPath: f.dir.file("copy.bin").string)
            #expect(!(await m.isDownloaded(f.server.url("/f/0.bin"))))
            #expect(try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path)) == a)
            await m.waitUntilAll(.completed)
            #expect(f.dir.read("0.bin") == body)
            await m.shutdown()
        }
    }

    @Test func pauseAllResumeAllRemoveAndDeleteFinishedFiles() async throws {
        try await ManagerFixture().run { f in
            let bodies = f.serveFiles(3, size: 40_000)
            let m = try f.manager(limit: 1, autoStart: false)
            var ids: [DownloadID] = []
            for i in bodies.indices { ids.append(try await m.add(f.server.url("/f/\(i).bin"), to: .directory(f.dir.path))) }
            await m.pauseAll()
            #expect(await m.downloads(in: .paused).count == 3)
            await m.start()
            #expect(await m.downloads(in: .running).isEmpty)
            try await m.setPriority(ids[2], 9)
            #expect(await m.download(ids[2])?.priority == 9)
            await m.resumeAll()
            await m.waitUntilAll(.completed)
            #expect(f.server.requests("/f/2.bin").count == 1)
            try await m.remove(ids[0], deleteFile: false)
            #expect(f.dir.read("0.bin") == bodies[0])
            try await m.remove(ids[1], deleteFile: true)
            #expect(f.dir.read("1.bin") == nil)
            #expect(try await m.deleteFinishedFiles() == 1)
            #expect(f.dir.read("2.bin") == nil)
            #expect(await m.downloads().isEmpty)
            await m.shutdown()
        }
    }

    @Test func failuresKeepTheirErrorAcrossRestartsAndCanBeRetried() async throws {
        try await ManagerFixture().run { f in
            let m = try f.manager()
            let id = try await m.add(f.server.url("/missing.bin"), to: .directory(f.dir.path))
            let view = await m.waitUntil { $0[id]?.state == .failed }
            #expect(view[id]?.failure?.category == .server)
            #expect(view[id]?.failure?.reason.contains("404") == true)
            await m.shutdown()

            let body = Resource.bytes(count: 30_000)
            f.server.set("/missing.bin", Resource(body: body))
            let again = try f.manager()
            #expect(await again.download(id)?.failure?.category == .server)
            try await again.resume(id)
            await again.waitUntil { $0[id]?.state == .completed }
            #expect(f.dir.read("missing.bin") == body)
            await again.shutdown()
        }
    }

    @Test func badInputIsRefusedWithAClearError() async throws {
        try await ManagerFixture().run { f in
            let m = try f.manager()
            let error = await #expect(throws: PickupError.self) { try await m.add("gopher://x/y", to: .directory(f.dir.path)) }
            #expect(error?.description == "not an http, https or ftp URL: gopher://x/y")
            #expect(error?.category == .usage)
            await #expect(throws: PickupError.self) { try await m.pause(DownloadID(rawValue: 42)) }
            await m.shutdown()
            await #expect(throws: PickupError.self) { try await m.add(f.server.url("/a"), to: .directory(f.dir.path)) }
        }
    }

    @Test func loweringTheLimitWhileRunningSendsDownloadsBackToWaiting() async throws {
        try await ManagerFixture().run { f in
            // Slow enough that none can finish before the limit goes down, however loaded the machine.
            let bodies = f.serveFiles(4, size: 3_000_000, rate: 100_000)
            let m = try f.manager(limit: 4)
            for i in bodies.indices { try await m.add(f.server.url("/f/\(i).bin"), to: .directory(f.dir.path)) }
            await m.waitUntil { v in v.values.filter { $0.state == .running }.count >= 2 }
            await m.setMaxConcurrentDownloads(1)
            // One keeps running; the others wait.
            await m.waitUntil { v in
                v.values.filter { $0.state == .running }.count == 1 && v.values.filter { $0.state == .waiting }.count == 3
            }
            for i in bodies.indices { f.server.update("/f/\(i).bin") { $0.bytesPerSecond = nil } }
            await m.setMaxConcurrentDownloads(4)
            // The running one's response keeps its pace: a pause and resume asks again, unthrottled.
            await m.pauseAll()
            await m.resumeAll()
            await m.waitUntilAll(.completed)
            for (i, body) in bodies.enumerated() { #expect(f.dir.read("\(i).bin") == body) }
            await m.shutdown()
        }
    }

    @Test func observersSeeASnapshotThenChangesAndCanComeAndGo() async throws {
        try await ManagerFixture().run { f in
            _ = f.serveFiles(3, size: 100_000)
            let m = try f.manager(autoStart: false)
            try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            // An observer that leaves early does not disturb the others.
            let early = Task { for await _ in await m.events() { break } }
            await early.value
            let stream = await m.events()
            try await m.add(f.server.url("/f/1.bin"), to: .directory(f.dir.path))
            await m.start()
            var iterator = stream.makeAsyncIterator()
            guard case .snapshot(let all, let totals)? = await iterator.next() else {
                Issue.record("the first event is not a snapshot")
                return
            }
            #expect(all.count == 1)
            #expect(totals.count(.waiting) == 1)
            guard case .added(let added)? = await iterator.next() else {
                Issue.record("the second event is not the addition")
                return
            }
            #expect(added.url == f.server.url("/f/1.bin"))
            await m.waitUntilAll(.completed)
            await m.shutdown()
            // The sequence ends with the manager.
            var rest = 0
            while await iterator.next() != nil { rest += 1 }
            #expect(rest > 0)
        }
    }

    @Test func progressFractionNeverGoesBackwards() async throws {
        try await ManagerFixture().run { f in
            _ = f.serveFiles(5, size: 300_000, rate: 3_000_000)
            let m = try f.manager(limit: 2, autoStart: false)
            for i in 0..<5 { try await m.add(f.server.url("/f/\(i).bin"), to: .directory(f.dir.path)) }
            let watcher = Task { () -> [Double] in
                var fractions: [Double] = []
                for await e in await m.events() {
                    if case .totals(let t) = e, let fr = t.fraction { fractions.append(fr) }
                    if case .totals(let t) = e, t.count(.completed) == 5 { break }
                }
                return fractions
            }
            await m.start()
            let fractions = await watcher.value
            #expect(fractions.count > 2)
            #expect(zip(fractions, fractions.dropFirst()).allSatisfy { $0 <= $1 })
            #expect(fractions.last == 1)
            await m.shutdown()
        }
    }

    @Test func speedLimitsPaceTheTransferAndKeepItByteExact() async throws {
        try await ManagerFixture().run { f in
            let body = f.serveFiles(1, size: 400_000)[0]
            var config = f.configuration()
            config.speedLimit = 1_000_000
            let m = try DownloadManager(configuration: config)
            let id = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path), speedLimit: 2_000_000)
            #expect(await m.download(id)?.speedLimit == 2_000_000)
            await m.waitUntilAll(.completed)
            #expect(f.dir.read("0.bin") == body)
            await m.setSpeedLimit(nil)
            #expect(await m.speedLimit == nil)
            await m.shutdown()
        }
    }

    @Test func tokenBucketAsksForPausesOnlyWhenOverTheRate() {
        let limiter = RateLimiter(bytesPerSecond: nil)
        #expect(limiter.take(10_000_000) == 0)
        limiter.bytesPerSecond = 1_000_000
        // The bucket holds at most a tenth of a second: two seconds' worth must wait about two seconds.
        let pause = limiter.take(2_000_000)
        #expect(pause > 1.5 && pause <= 2.0)
        limiter.bytesPerSecond = nil
        #expect(limiter.take(2_000_000) == 0)
    }

    /// A limit holds a transfer back when it goes near the limit and the bucket made it pause
    /// lately; not when it is unlimited, never paused, or far slower than the limit.
    @Test func aLimitHoldsOnlyWhatGoesNearItAndPauses() {
        let limiter = RateLimiter(bytesPerSecond: nil)
        _ = limiter.take(10_000_000)
        #expect(!limiter.holds(atSpeed: 5_000_000), "unlimited")
        limiter.bytesPerSecond = 1_000_000
        #expect(!limiter.holds(atSpeed: 1_000_000), "no pause yet")
        #expect(limiter.take(2_000_000) > 0)
        #expect(limiter.holds(atSpeed: 950_000))
        #expect(!limiter.holds(atSpeed: 300_000), "far slower than the limit: held by something else")
        #expect(limiter.holds(atSpeed: 300_000, stalled: true), "a stall while it pauses connections is its doing")
        #expect(!RateLimiter(bytesPerSecond: 1_000_000).holds(atSpeed: 0, stalled: true), "a stall without a pause is not")
    }
}
