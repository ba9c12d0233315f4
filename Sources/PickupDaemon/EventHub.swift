import Atomics
import Dispatch
import Hummingbird
import NIOConcurrencyHelpers
import Pickup
import SystemPackage

/// Fans the manager's changes out to the event-stream clients with bounded memory per client.
///
/// One subscription to the manager; each change is framed once (its SSE bytes, shared by every
/// client's queue). Each client has a queue bounded by bytes: one that falls more than
/// `maxBuffered` bytes behind is cut off (its stream ends; it reconnects for a new snapshot). At
/// most `maxClients` follow at once; one more gets 503. The snapshot a client starts with is not
/// held whole either: ``Routes`` writes it page by page from the manager (see ``stream(_:)``).
final class EventHub: Sendable {
    /// One change, framed.
    struct Item: Sendable {
        let seq: UInt64
        /// The download whose state it carries (nil for notices and totals, which a page never holds).
        let download: DownloadID?
        let isTotals: Bool
        let frame: ByteBuffer
    }

    final class Client: Sendable {
        let key: Int
        let continuation: AsyncStream<Item>.Continuation
        let buffered = ManagedAtomic(0)
        /// When the write in progress began (monotonic nanoseconds), 0 when none is.
        let writingSince = ManagedAtomic<UInt64>(0)
        init(key: Int, continuation: AsyncStream<Item>.Continuation) {
            self.key = key
            self.continuation = continuation
        }
    }

    struct State {
        var clients: [Int: Client] = [:]
        var next = 0
        var lastSeq: UInt64 = 0
        var closed = false
    }

    let maxClients: Int
    let maxBuffered: Int
    /// A client whose socket takes nothing for this long is cut off.
    let writeTimeout: Duration = .seconds(30)
    let pageSize: Int
    let state = NIOLockedValueBox(State())

    init(maxClients: Int = 128, maxBuffered: Int = 1 << 20, pageSize: Int = 256) {
        self.maxClients = maxClients
        self.maxBuffered = maxBuffered
        self.pageSize = pageSize
    }

    /// Subscribes to `manager` and fans its changes out until the manager shuts down; then every
    /// client's stream ends (an open event stream would otherwise hold the server's shutdown).
    func start(_ manager: DownloadManager, root: FilePath) async {
        let (after, changes) = await manager.changes()
        state.withLockedValue { $0.lastSeq = after }
        Task {
            for await change in changes {
                // Nobody follows: nothing to frame (a client that joins now starts after this change).
                let idle = state.withLockedValue { s -> Bool in
                    guard s.clients.isEmpty else { return false }
                    s.lastSeq = change.seq
                    return true
                }
                if idle { continue }
                let item = Item(seq: change.seq, download: Self.stateOf(change), isTotals: Self.isTotals(change),
                                frame: Routes.frame(change.event, root: root))
                let size = item.frame.readableBytes
                let cut = state.withLockedValue { s -> [Client] in
                    s.lastSeq = change.seq
                    var cut: [Client] = []
                    for c in s.clients.values {
                        if c.buffered.wrappingIncrementThenLoad(by: size, ordering: .relaxed) > maxBuffered {
                            cut.append(c)
                        } else {
                            c.continuation.yield(item)
                        }
                    }
                    for c in cut { s.clients[c.key] = nil }
                    return cut
                }
                for c in cut { c.continuation.finish() }
            }
            let all = state.withLockedValue { s -> [Client] in
                s.closed = true
                defer { s.clients = [:] }
                return Array(s.clients.values)
            }
            for c in all { c.continuation.finish() }
        }
    }

    static func stateOf(_ change: SequencedEvent) -> DownloadID? {
        switch change.event {
        case .added(let i), .changed(let i): i.id
        case .progress(let id, _), .removed(let id): id
        case .notice, .totals, .snapshot: nil
        }
    }

    static func isTotals(_ change: SequencedEvent) -> Bool {
        if case .totals = change.event { return true }
        return false
    }

    /// A new client: the number of the last change before its queue, its queue, and its handle;
    /// nil when `maxClients` already follow or the daemon is stopping.
    func join() -> (after: UInt64, items: AsyncStream<Item>, client: Client)? {
        let (items, continuation) = AsyncStream<Item>.makeStream()
        let joined = state.withLockedValue { s -> (UInt64, Client)? in
            guard !s.closed, s.clients.count < maxClients else { return nil }
            let c = Client(key: s.next, continuation: continuation)
            s.next += 1
            s.clients[c.key] = c
            return (s.lastSeq, c)
        }
        guard let (after, client) = joined else { return nil }
        continuation.onTermination = { [weak self] _ in self?.leave(client) }
        return (after, items, client)
    }

    func leave(_ client: Client) {
        state.withLockedValue { _ = $0.clients.removeValue(forKey: client.key) }
    }

    /// Serves one client: its stream (``stream(_:root:to:after:items:client:)``) beside a watchdog
    /// that ends it when a write has taken longer than `writeTimeout` (a client that stopped reading
    /// in the middle of a snapshot) or the daemon is stopping: a blocked write would otherwise hold
    /// the server's shutdown forever.
    func serve(_ manager: DownloadManager, root: FilePath, to writer: inout any ResponseBodyWriter,
               after: UInt64, items: AsyncStream<Item>, client: Client) async throws {
        let box = WriterBox(writer)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await self.stream(manager, root: root, to: &box.writer, after: after, items: items, client: client)
            }
            group.addTask { try await self.watch(client) }
            // The first to end ends the other: the stream (the client was cut off or the daemon is
            // stopping), or the watchdog (which throws, cancelling a blocked write).
            _ = try await group.next()
            group.cancelAll()
        }
        writer = box.writer
    }

    /// Returns never; throws once `client`'s write in progress is older than `writeTimeout`, or the
    /// hub is closed while one is in progress.
    func watch(_ client: Client) async throws {
        let limit = UInt64(writeTimeout.components.seconds) * 1_000_000_000
        while true {
            try await Task.sleep(nanoseconds: 1_000_000_000)
            let since = client.writingSince.load(ordering: .relaxed)
            guard since > 0 else { continue }
            if state.withLockedValue({ $0.closed }) || DispatchTime.now().uptimeNanoseconds - since > limit {
                throw CancellationError()
            }
        }
    }

    /// Writes `buffer`, noting for the watchdog when the write began.
    func write(_ buffer: ByteBuffer, to writer: inout any ResponseBodyWriter, client: Client) async throws {
        client.writingSince.store(max(1, DispatchTime.now().uptimeNanoseconds), ordering: .relaxed)
        defer { client.writingSince.store(0, ordering: .relaxed) }
        try await writer.write(buffer)
    }

    /// Writes one client's stream: the snapshot page by page as the manager has it now (each
    /// page tagged with the number of the last change it reflects), then every change from its
    /// queue that the page of its download does not already reflect.
    func stream(_ manager: DownloadManager, root: FilePath, to writer: inout any ResponseBodyWriter,
                after: UInt64, items: AsyncStream<Item>, client: Client) async throws {
        try await write(ByteBuffer(string: ": pickup events\n\nevent: snapshot\ndata: {\"downloads\":["), to: &writer, client: client)
        var cursor: DownloadID? = nil
        // The last id of each page with the change number it reflects (the last page covers every id beyond).
        var pages: [(last: DownloadID, seq: UInt64)] = []
        var first = true
        var totals: ManagerTotals? = nil
        while true {
            let page = await manager.snapshotPage(after: cursor, limit: pageSize)
            var w = JSONWriter(capacity: 64 + page.downloads.count * 320)
            for d in page.downloads {
                if !first { w.raw(",") }
                first = false
                APIDownload(d, root: root).write(to: &w)
            }
            try await write(ByteBuffer(bytes: w.bytes), to: &writer, client: client)
            if page.isLast {
                pages.append((DownloadID(rawValue: .max), page.seq))
                totals = page.totals
                break
            }
            cursor = page.downloads.last?.id
            pages.append((cursor ?? DownloadID(rawValue: .max), page.seq))
        }
        var tail = Array("],\"totals\":".utf8)
        tail += totals.flatMap { try? JSON.encoder.encode(APITotals($0)) }.map(Array.init) ?? Array("{}".utf8)
        tail += Array("}\n\n".utf8)
        try await write(ByteBuffer(bytes: tail), to: &writer, client: client)
        let snapshotSeq = pages.last?.seq ?? after
        for await item in items {
            client.buffered.wrappingDecrement(by: item.frame.readableBytes, ordering: .relaxed)
            if item.seq <= snapshotSeq {
                if item.isTotals { continue }
                if let id = item.download, let page = pages.first(where: { $0.last >= id }), item.seq <= page.seq { continue }
            }
            try await write(item.frame, to: &writer, client: client)
        }
    }
}

/// A response body writer that a child task can use while its parent waits.
final class WriterBox: @unchecked Sendable {
    var writer: any ResponseBodyWriter
    init(_ writer: any ResponseBodyWriter) { self.writer = writer }
}
