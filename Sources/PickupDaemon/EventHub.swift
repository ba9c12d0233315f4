import Atomics
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

    /// Writes one client's stream: the snapshot page by page as the manager has it now (each
    /// page tagged with the number of the last change it reflects), then every change from its
    /// queue that the page of its download does not already reflect.
    func stream(_ manager: DownloadManager, root: FilePath, to writer: inout any ResponseBodyWriter,
                after: UInt64, items: AsyncStream<Item>, client: Client) async throws {
        try await writer.write(ByteBuffer(string: ": pickup events\n\nevent: snapshot\ndata: {\"downloads\":["))
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
            try await writer.write(ByteBuffer(bytes: w.bytes))
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
        try await writer.write(ByteBuffer(bytes: tail))
        let snapshotSeq = pages.last?.seq ?? after
        for await item in items {
            client.buffered.wrappingDecrement(by: item.frame.readableBytes, ordering: .relaxed)
            if item.seq <= snapshotSeq {
                if item.isTotals { continue }
                if let id = item.download, let page = pages.first(where: { $0.last >= id }), item.seq <= page.seq { continue }
            }
            try await writer.write(item.frame)
        }
    }
}
