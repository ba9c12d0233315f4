import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

@Suite struct MultiConnectionTests {
    let body = Resource.bytes(count: 8 * 1024 * 1024 + 5, seed: 3)

    @Test func sixteenConnectionsAreByteExactAndEveryRangeIsValidated() async throws {
        try await Fixture(connections: 16).run { f in
            f.server.set("/m.bin", Resource(body: body, bytesPerSecond: 8 * 1024 * 1024))
            _ = try await f.get("/m.bin")
            #expect(f.dir.read("m.bin") == body)
            let req = f.server.requests("/m.bin")
            #expect(req.count >= 16)
            #expect(req[0].headers["range"] == "bytes=0-")
            // Only the first request is open-ended: its answer tells the length.
            #expect(req.dropFirst().allSatisfy { $0.headers["if-range"] == "\"v1\"" && $0.headers["range"]?.hasSuffix("-") == false })
            #expect(f.server.bytesSent("/m.bin") >= body.count)
            #expect(f.dir.entries == ["m.bin"])
        }
    }

    @Test func oneSlowConnectionDoesNotHoldTheDownloadHostage() async throws {
        try await Fixture(connections: 4).run { f in
            f.server.set("/s.bin", {
                var r = Resource(body: body, bytesPerSecond: 16 * 1024 * 1024)
                // (Slow enough that the others finish first even with every test running at once.)
                r.firstRangeBytesPerSecond = 96 * 1024
                return r
            }())
            _ = try await f.get("/s.bin")
            #expect(f.dir.read("s.bin") == body)
            // The first (slow) connection's range was a quarter of the file; the others took part of it over.
            let first = f.server.requests("/s.bin")[0]
            #expect(first.bytesSent < body.count / 4, "\(f.server.requests("/s.bin").map { "\($0.connection) \($0.headers["range"] ?? "") \($0.bytesSent)" })")
        }
    }

    /// Ranges are asked for in pieces and split between them, and a connection whose response was
    /// cut (the first, open-ended one, or a slow one's) takes no more work that would need a new
    /// connection: four connections, the first two hundred times slower than the others (so even
    /// with every test running at once: at fifty times, a loaded machine's fast connections had not
    /// finished theirs before the slow one had its quarter), open four TCP connections in all, and
    /// the file is byte-exact.
    @Test func aSlowConnectionsRangeIsTakenOverWithoutOpeningMoreConnections() async throws {
        try await Fixture(connections: 4).run { f in
            let body = Resource.bytes(count: 24 * 1024 * 1024 + 77, seed: 5)
            f.server.set("/p.bin", {
                var r = Resource(body: body, bytesPerSecond: 24 * 1024 * 1024)
                r.firstRangeBytesPerSecond = 128 * 1024
                return r
            }())
            _ = try await f.get("/p.bin")
            #expect(f.dir.read("p.bin") == body)
            let requests = f.server.requests("/p.bin")
            let seen = requests.map { "\($0.connection) \($0.headers["range"] ?? "") \($0.bytesSent)" }
            #expect(requests[0].bytesSent < body.count / 4, "the slow range was not taken over: \(seen)")
            #expect(f.server.connectionsOpened <= 4, "\(f.server.connectionsOpened) connections: \(seen) \(f.events.notices)")
        }
    }

    @Test func aRangeStalledNearItsEndIsTakenOverByAConnectionOutOfWork() async throws {
        // The first connection gets all but 20 KiB of its half (less than the minimum split) and
        // then nothing more; the stall timeout is far away, so only the endgame finishes quickly,
        // and without a retry.
        try await Fixture(stall: 30, connections: 2).run { f in
            let body = Resource.bytes(count: 4 * 1024 * 1024, seed: 9)
            let tail = 2 * 1024 * 1024 - 20 * 1024
            f.server.set("/e.bin", {
                var r = Resource(body: body, bytesPerSecond: 4 * 1024 * 1024)
                r.firstRangeBytesPerSecond = 64 * 1024 * 1024
                r.firstRangeStallAfter = tail
                return r
            }())
            _ = try await f.get("/e.bin")
            #expect(f.dir.read("e.bin") == body)
            let requests = f.server.requests("/e.bin")
            #expect(requests.first?.bytesSent == tail)
            #expect(requests.contains { $0.headers["range"] == "bytes=\(tail)-\(2 * 1024 * 1024 - 1)" })
            #expect(f.events.notices.isEmpty, "the stalled range was retried: \(f.events.notices)")
        }
    }

    /// Servers and files that one connection must serve alone, silently.
    enum OneConnection: String, CaseIterable, Sendable {
        case noRangeSupport, onlyAWeakETag, smallFile
    }

    @Test(arguments: OneConnection.allCases)
    func fallsBackToOneConnectionSilently(_ reason: OneConnection) async throws {
        try await Fixture(connections: 8).run { f in
            let resource = switch reason {
            case .noRangeSupport: Resource(body: body, acceptRanges: false)
            case .onlyAWeakETag: Resource(body: body, etag: "W/\"weak\"")
            case .smallFile: Resource(body: Array(body.prefix(100_000)))
            }
            f.server.set("/one", resource)
            _ = try await f.get("/one")
            #expect(f.dir.read("one") == resource.body)
            #expect(f.server.requests("/one").count == 1)
        }
    }

    @Test func fileChangingMidDownloadIsNeverCombined() async throws {
        try await Fixture(connections: 8).run { f in
            let v2 = Resource.bytes(count: body.count, seed: 77)
            f.server.set("/c.bin", Resource(body: body, bytesPerSecond: 4 * 1024 * 1024))
            f.server.change("/c.bin", afterRequests: 1, to: Resource(body: v2, etag: "\"v2\""))
            _ = try await f.get("/c.bin")
            #expect(f.dir.read("c.bin") == v2)
            // The first connection to see v2 gets it whole (200, its If-Range failed): it is kept as
            // the one stream, and every byte of v1 is discarded.
            #expect(f.events.notices.contains { $0.contains("held bytes are discarded") }, "\(f.events.notices)")
        }
    }

    @Test func failingConnectionsAreRetiredAndTheirRangesTakenOver() async throws {
        try await Fixture(connections: 8, backoff: 0.1).run { f in
            f.server.set("/r.bin", {
                var r = Resource(body: body, bytesPerSecond: 8 * 1024 * 1024)
                r.maxConcurrent = 2
                return r
            }())
            _ = try await f.get("/r.bin")
            #expect(f.dir.read("r.bin") == body)
            // The server turned connections away, and the download still finished with those it accepted.
            #expect(f.server.requests("/r.bin").contains { $0.status == 503 })
        }
    }

    @Test func dropsOnSeveralConnectionsResumeEachRange() async throws {
        try await Fixture(connections: 4).run { f in
            f.server.set("/d.bin", Resource(body: body, faults: Array(repeating: .dropAfter(400_000), count: 6)))
            _ = try await f.get("/d.bin")
            #expect(f.dir.read("d.bin") == body)
            #expect(f.server.bytesSent("/d.bin") < body.count + 4 * 1024 * 1024)
        }
    }

    @Test func interruptedMultiConnectionDownloadResumesEveryRange() async throws {
        try await Fixture(stall: 600, connections: 8).run { f in
            // Each connection's first answer stops after 400 KB (paced, and waited on): the
            // download cannot finish before the cancel lands, however loaded the machine.
            f.server.set("/i.bin", Resource(body: body, faults: Array(repeating: .stallAfter(400_000), count: 8), bytesPerSecond: 128 * 1024))
            let task = await f.startInBackground("/i.bin", after: 2_000_000)
            task.cancel()
            _ = await task.result
            let ctl = try #require(f.dir.entries.first { $0.hasSuffix(".pickup-ctl") }.flatMap { ControlFile.load(f.dir.file($0)) })
            #expect(ctl.segments.count >= 8)
            #expect(ctl.segments.filter { $0.done > 0 }.count >= 2)
            let requestsBefore = f.server.requests("/i.bin").count
            f.server.update("/i.bin") { $0.bytesPerSecond = nil }
            _ = try await f.get("/i.bin")
            #expect(f.dir.read("i.bin") == body)
            // The rerun fetched only what was not durable, in ranges starting where each one stopped,
            // over several connections again.
            let rerun = f.server.requests("/i.bin").dropFirst(requestsBefore)
            #expect(rerun.count > 1)
            // No request of the rerun asks for a byte that was durable.
            let durable = ctl.segments.map { $0.start..<($0.start + $0.done) }
            for request in rerun {
                guard let range = request.headers["range"], let dash = range.firstIndex(of: "-"),
                    let first = Int64(range.dropFirst(6).prefix(upTo: dash)), let last = Int64(range[range.index(after: dash)...])
                else {
                    Issue.record("rerun request without an exact range: \(request.headers["range"] ?? "none")")
                    continue
                }
                #expect(!durable.contains { $0.overlaps(first..<(last + 1)) }, "\(range) asks for durable bytes")
            }
            for seg in ctl.segments where seg.done > 0 && seg.done < seg.end! - seg.start {
                #expect(rerun.contains { $0.headers["range"]?.hasPrefix("bytes=\(seg.start + seg.done)-") == true })
            }
        }
    }

    @Test func preallocationReservesTheWholeLength() async throws {
        var options = DownloadOptions()
        options.preallocate = true
        options.connections = 4
        options.minSplitSize = 64 * 1024
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir()
        options.stateDirectory = state.path
        server.set("/p.bin", Resource(body: body, bytesPerSecond: 4 * 1024 * 1024))
        let downloader = Downloader(options: options)
        let partial = LockedBox<Int64?>(nil)
        _ = try await downloader.download(DownloadRequest(url: server.url("/p.bin"), destination: .file(dir.file("p.bin")))) {
            if case .progress(let p) = $0, p.bytesDone > 0, partial.value == nil {
                partial.value = FS.size(FilePath(dir.file("p.bin").string + ".pickup-part"))
            }
        }
        #expect(partial.value == Int64(body.count))
        #expect(dir.read("p.bin") == body)
        await downloader.shutdown()
        await server.stop()
    }
}

final class LockedBox<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var _value: T
    init(_ v: T) { _value = v }
    var value: T {
        get { lock.withLock { _value } }
        set { lock.withLock { _value = newValue } }
    }
}
