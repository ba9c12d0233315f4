import Foundation
import HTTPTypes
import NIOConcurrencyHelpers
import Hummingbird
import NIOCore
@testable import PickupDaemon
import SystemPackage
import Testing

@testable import Pickup

/// Collects what an event stream writes.
struct CollectingWriter: ResponseBodyWriter {
    let sink: NSLockedBytes
    /// Runs after each write of the snapshot: what happens while it is being written.
    var duringSnapshot: @Sendable () async throws -> Void = {}
    /// Told once the snapshot is written.
    var afterSnapshot: @Sendable () -> Void = {}
    var snapshotWritten = false
    mutating func write(_ buffer: ByteBuffer) async throws {
        sink.append(Array(buffer.readableBytesView))
        if snapshotWritten { return }
        if buffer.readableBytesView.starts(with: Array("],\"totals\":".utf8)) {
            snapshotWritten = true
            afterSnapshot()
        } else {
            try await duringSnapshot()
        }
    }
    mutating func write(contentsOf buffers: some Sequence<ByteBuffer>) async throws {
        for b in buffers { try await write(b) }
    }
    consuming func finish(_ trailingHeaders: HTTPFields?) async throws {}
}

final class NSLockedBytes: @unchecked Sendable {
    private let lock = NSLock()
    private var bytes: [UInt8] = []
    func append(_ b: [UInt8]) { lock.withLock { bytes += b } }
    var text: String { lock.withLock { String(decoding: bytes, as: UTF8.self) } }
}

/// The SSE frames of a stream, as (event, data).
func frames(_ text: String) -> [(String, Data)] {
    text.components(separatedBy: "\n\n").compactMap { block in
        var event = "", data = ""
        for line in block.split(separator: "\n") {
            if line.hasPrefix("event: ") { event = String(line.dropFirst(7)) }
            if line.hasPrefix("data: ") { data = String(line.dropFirst(6)) }
        }
        return event.isEmpty ? nil : (event, Data(data.utf8))
    }
}

@Suite struct EventHubTests {
    func manager(_ state: TempDir, count: Int) async throws -> DownloadManager {
        var c = DownloadManager.Configuration(stateDirectory: state.path)
        c.autoStart = false
        let m = try DownloadManager(configuration: c)
        _ = try await m.add((0..<count).map { NewDownload(url: "http://127.0.0.1:1/f\($0)", to: .directory(state.path), paused: true) })
        return m
    }

    /// A snapshot written page by page while downloads change, are added and removed, followed by
    /// the changes after it, adds up to exactly the manager's state: no change lost, none applied
    /// over a newer page.
    @Test func aPagedSnapshotAndTheChangesAfterItAreConsistent() async throws {
        let state = TempDir()
        let m = try await manager(state, count: 300)
        let hub = EventHub(pageSize: 7)
        await hub.start(m, root: state.path)
        let (after, items, client) = try #require(hub.join())
        let sink = NSLockedBytes()
        let counter = NIOLockedValueBox((rng: SplitMix(state: 7), step: 0))
        // Changes between the pages (after each write of the snapshot), and after the snapshot.
        @Sendable func change() async throws {
            let ids = await m.downloads().map(\.id)
            for _ in 0..<5 {
                let (pick, i) = counter.withLockedValue { c -> (Int, Int) in
                    c.step += 1
                    return (Int(c.rng.next() % UInt64(ids.count)), c.step)
                }
                switch i % 10 {
                case 0: try? await m.remove(ids[pick])
                case 1: _ = try await m.add("http://127.0.0.1:1/new\(i)", to: .directory(state.path), paused: true)
                default: try? await m.setPriority(ids[pick], i)
                }
            }
        }
        let (written, signal) = AsyncStream<Void>.makeStream()
        let stream = Task {
            var writer: any ResponseBodyWriter = CollectingWriter(sink: sink, duringSnapshot: change,
                                                                  afterSnapshot: { signal.yield() })
            try await hub.stream(m, root: state.path, to: &writer, after: after, items: items, client: client)
        }
        for await _ in written { break }
        for _ in 0..<40 { try await change() }
        let final = await m.downloads()
        await m.shutdown()
        try await stream.value
        var view: [Int64: Int] = [:]
        var regressions = 0
        let decoder = JSONDecoder()
        for (event, data) in frames(sink.text) {
            switch event {
            case "snapshot": for d in try decoder.decode(APISnapshot.self, from: data).downloads { view[d.id] = d.priority }
            case "added", "changed":
                // Priorities only ever go up in this test: a lower one is an old change applied over a newer page.
                let d = try decoder.decode(APIDownload.self, from: data)
                if let seen = view[d.id], d.priority < seen { regressions += 1 }
                view[d.id] = d.priority
            case "removed": view[try decoder.decode(APIRef.self, from: data).id] = nil
            default: break
            }
        }
        #expect(regressions == 0)
        #expect(view == Dictionary(uniqueKeysWithValues: final.map { ($0.id.rawValue, $0.priority) }))
    }

    /// A client that reads nothing is cut off once its queue passes the byte limit, and no longer counts.
    @Test func aClientThatDoesNotReadIsCutOffByBytes() async throws {
        let state = TempDir()
        let m = try await manager(state, count: 0)
        let hub = EventHub(maxClients: 1, maxBuffered: 8192)
        await hub.start(m, root: state.path)
        let (_, items, _) = try #require(hub.join())
        #expect(hub.join() == nil, "the second client is over the cap")
        _ = try await m.add((0..<200).map { NewDownload(url: "http://127.0.0.1:1/g\($0)", to: .directory(state.path), paused: true) })
        var received = 0
        for await _ in items { received += 1 }  // ends: it was cut off
        #expect(received < 200)
        #expect(received > 0)
        #expect(hub.join() != nil, "a client that was cut off leaves room for another")
        await m.shutdown()
    }

    @Test func eventStreamsOverTheCapGet503() async throws {
        try await DaemonFixture { $0.maxEventClients = 1 }.run { f in
            let (opened, signal) = AsyncStream<Void>.makeStream()
            let first = Task {
                for try await (event, _) in f.client.events() where event == "snapshot" { signal.yield() }
            }
            for await _ in opened { break }
            let second = try await f.api(.GET, "/events")
            #expect(second.status == 503)
            #expect(second.body.contains("too_many_clients"))
            first.cancel()
        }
    }

    /// A client that stops reading in the middle of its snapshot does not hold the daemon's
    /// shutdown: the write it is blocked in ends when the hub closes (the suite's time limit is the guard).
    @Test(.timeLimit(.minutes(1))) func aStalledClientDoesNotHoldTheShutdown() async throws {
        let state = TempDir()
        let m = try await manager(state, count: 10)
        let hub = EventHub()
        await hub.start(m, root: state.path)
        let (after, items, client) = try #require(hub.join())
        let (blocked, signal) = AsyncStream<Void>.makeStream()
        let serving = Task {
            var writer: any ResponseBodyWriter = StalledWriter(onWrite: { signal.yield() })
            try await hub.serve(m, root: state.path, to: &writer, after: after, items: items, client: client)
        }
        for await _ in blocked { break }
        await m.shutdown()
        await #expect(throws: CancellationError.self) { try await serving.value }
    }
}

/// A client that takes nothing: every write waits until it is cancelled.
struct StalledWriter: ResponseBodyWriter {
    let onWrite: @Sendable () -> Void
    let never = AsyncStream<Void>.makeStream()
    mutating func write(_ buffer: ByteBuffer) async throws {
        onWrite()
        for await _ in never.stream {}
        throw CancellationError()
    }
    mutating func write(contentsOf buffers: some Sequence<ByteBuffer>) async throws {
        for b in buffers { try await write(b) }
    }
    consuming func finish(_ trailingHeaders: HTTPFields?) async throws {}
}
