import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix

/// An HTTP/1.1 server on 127.0.0.1 for tests, serving ``Resource``s with injected faults, and
/// recording every request so tests can assert what the client sent.
public final class TestServer: Sendable {
    let channel: any Channel
    let state: NIOLockedValueBox<State>

    struct State {
        var resources: [String: Resource] = [:]
        var log: [RecordedRequest] = []
        var active: [String: Int] = [:]
        var changes: [String: (after: Int, to: Resource)] = [:]
        var closed: Set<Int> = []
        /// Responses with a body being sent now, over all paths, and the most there ever were.
        var activeTotal = 0
        var peakTotal = 0
        /// Connections given a backend so far (``Resource/backendETags``).
        var connections = 0
        /// Paths whose bodies in progress wait before their next chunk (``hold(_:)``).
        var held: Set<String> = []
    }

    /// The port it listens on.
    public let port: Int
    /// `http://127.0.0.1:PORT`.
    public var baseURL: String { "http://127.0.0.1:\(port)" }

    /// Starts a server on an ephemeral port.
    public static func start() async throws -> TestServer {
        let state = NIOLockedValueBox(State())
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    var config = HTTPResponseEncoder.Configuration()
                    config.automaticallySetFramingHeaders = false
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(HTTPResponseEncoder(configuration: config))
                    try sync.addHandler(ByteToMessageHandler(HTTPRequestDecoder()))
                    try sync.addHandler(Handler(state: state))
                }
            }
        let channel = try await Ports.bindNew { try await bootstrap.bind(host: "127.0.0.1", port: 0).get() }
        return TestServer(channel: channel, state: state)
    }

    init(channel: any Channel, state: NIOLockedValueBox<State>) {
        self.channel = channel
        self.state = state
        self.port = channel.localAddress?.port ?? 0
    }

    /// Stops listening (open connections are left to close by themselves).
    public func stop() async {
        try? await channel.close()
    }

    /// A server no test holds any more stops listening, also when its test threw before
    /// ``stop()`` (the close is queued on the event loop, nothing waits here).
    deinit { channel.close(promise: nil) }

    /// Serves `resource` at `path` (replacing what was there: a "changed on the server" file).
    public func set(_ path: String, _ resource: Resource) {
        state.withLockedValue { $0.resources[path] = resource }
    }

    /// Changes the resource at `path` in place.
    public func update(_ path: String, _ change: @Sendable (inout Resource) -> Void) {
        state.withLockedValue { s in
            if var r = s.resources[path] {
                change(&r)
                s.resources[path] = r
            }
        }
    }

    /// Holds the bodies of `path`'s responses in progress: none sends another chunk (a chunk already
    /// counted in ``bytesSent(_:)`` may still reach the socket) until ``release(_:)``. A test that
    /// stops a client holds the server too, so what is in flight to the stopped client stays what
    /// it was at the stop, however long the test takes to measure it.
    public func hold(_ path: String) {
        state.withLockedValue { _ = $0.held.insert(path) }
    }

    /// Lets `path`'s responses go on.
    public func release(_ path: String) {
        state.withLockedValue { _ = $0.held.remove(path) }
    }

    /// Replaces the resource at `path` once it has received `requests` requests (it changes on the
    /// server in the middle of a download).
    public func change(_ path: String, afterRequests requests: Int, to resource: Resource) {
        state.withLockedValue { $0.changes[path] = (requests, resource) }
    }

    /// Requests received for `path` so far.
    public func requests(_ path: String) -> [RecordedRequest] {
        state.withLockedValue { $0.log.filter { $0.uri == path } }
    }

    /// File bytes sent for `path` (bodies of 200 and 206 responses).
    public func bytesSent(_ path: String) -> Int {
        requests(path).filter { $0.status == 200 || $0.status == 206 }.reduce(0) { $0 + $1.bytesSent }
    }

    /// The most 200/206 responses that were being sent at the same time, over all paths.
    public var peakConcurrentTransfers: Int { state.withLockedValue { $0.peakTotal } }

    /// Connections that sent a request so far, over all paths.
    public var connectionsOpened: Int { state.withLockedValue { $0.connections } }

    /// `URL` of a path on this server.
    public func url(_ path: String) -> String { baseURL + path }
}

/// What to send for one request, decided under the lock.
struct Plan {
    var status: Int
    var headers: [(String, String)]
    var body: ArraySlice<UInt8>
    var fault: Fault?
    var rate: Int?
    var logIndex: Int
    var path: String = ""
    var delay: Double? = nil
}

final class Handler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let state: NIOLockedValueBox<TestServer.State>
    var head: HTTPRequestHead?
    var busy = false
    /// This connection's place among all connections (the backend a load balancer sends it to).
    var connection: Int?

    init(state: NIOLockedValueBox<TestServer.State>) { self.state = state }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let h): head = h
        case .body: break
        case .end:
            guard let h = head else { return }
            head = nil
            let plan = state.withLockedValue { s -> Plan in
                if connection == nil {
                    connection = s.connections
                    s.connections += 1
                }
                return Self.plan(h, state: &s, connection: connection ?? 0)
            }
            respond(context: context, plan: plan, keepAlive: h.isKeepAlive)
        }
    }

    static func plan(_ req: HTTPRequestHead, state: inout TestServer.State, connection: Int = 0) -> Plan {
        var recorded = [String: String]()
        for (n, v) in req.headers { recorded[n.lowercased()] = v }
        state.log.append(RecordedRequest(uri: req.uri, headers: recorded, status: 0, bytesSent: 0, connection: connection))
        let index = state.log.count - 1
        let path = String(req.uri.split(separator: "?", maxSplits: 1).first ?? "")
        state.log[index].concurrent = state.active[path, default: 0]
        guard var r = state.resources[path] ?? state.resources[req.uri] else {
            return Plan(status: 404, headers: [], body: ArraySlice("not found".utf8), fault: nil, rate: nil, logIndex: index)
        }
        if let redirect = r.redirect {
            return Plan(status: redirect.status, headers: [("Location", redirect.location)] + r.headers.map { ($0.key, $0.value) },
                        body: [], fault: nil, rate: nil, logIndex: index)
        }
        var fault = r.faults.isEmpty ? nil : r.faults.removeFirst()
        if let tags = r.backendETags, !tags.isEmpty {
            // This connection's backend: its own validators for the same bytes.
            let tag = tags[connection % tags.count]
            r.etag = tag
            r.lastModified = "Sun, 0\(1 + connection % tags.count) Nov 2026 10:00:00 GMT"
        }
        if fault == nil, let n = r.firstRangeStallAfter, recorded["range"]?.hasPrefix("bytes=0-") == true { fault = .stallAfter(n) }
        if var stored = state.resources[path] {
            stored.faults = r.faults
            state.resources[path] = stored
        }
        if let change = state.changes[path], state.log.filter({ $0.uri == req.uri }).count >= change.after {
            state.resources[path] = change.to
            state.changes[path] = nil
        }
        if let limit = r.maxConcurrent, state.active[path, default: 0] >= limit {
            return Plan(status: 503, headers: [], body: ArraySlice("busy".utf8), fault: nil, rate: nil, logIndex: index)
        }
        if case .status(let code, let hs)? = fault {
            return Plan(status: code, headers: hs.map { ($0.key, $0.value) }, body: ArraySlice("injected \(code)".utf8),
                        fault: nil, rate: nil, logIndex: index)
        }
        var headers: [(String, String)] = []
        if let e = r.etag { headers.append(("ETag", e)) }
        if let lm = r.lastModified { headers.append(("Last-Modified", lm)) }
        if let cd = r.contentDisposition { headers.append(("Content-Disposition", cd)) }
        if r.acceptRanges { headers.append(("Accept-Ranges", "bytes")) }
        for (k, v) in r.headers { headers.append((k, v)) }
        let total = r.body.count
        // Preconditions (RFC 9110 §13.1.1, §13.1.4, in §13.2.2's order: before If-None-Match): a
        // representation other than the one named is not sent (412, no body). (Dates compared as
        // text: any other date is a change here.)
        if !r.ignoresConditionals {
            if let im = recorded["if-match"] {
                let matches = im.trimmingCharacters(in: .whitespaces) == "*"
                    || (r.etag.map { e in !e.hasPrefix("W/") && Self.entityTags(im).contains(e) } ?? false)
                if !matches { return Plan(status: 412, headers: headers, body: [], fault: nil, rate: nil, logIndex: index) }
            } else if let since = recorded["if-unmodified-since"], let lm = r.lastModified, since != lm {
                return Plan(status: 412, headers: headers, body: [], fault: nil, rate: nil, logIndex: index)
            }
        }
        // Conditional GET (If-Modified-Since only without If-None-Match, RFC 9110 §13.1.3; dates
        // compared as text, as above: the same date is no modification).
        if !r.ignoresConditionals, let inm = recorded["if-none-match"], let e = r.etag, inm == e || inm == "*" {
            return Plan(status: 304, headers: headers, body: [], fault: nil, rate: nil, logIndex: index)
        }
        if !r.ignoresConditionals, recorded["if-none-match"] == nil, let ims = recorded["if-modified-since"], let lm = r.lastModified, ims == lm {
            return Plan(status: 304, headers: headers, body: [], fault: nil, rate: nil, logIndex: index)
        }
        var status = 200
        var slice = r.body[...]
        if r.acceptRanges, fault != .ignoreRange, let range = recorded["range"], let (first, last) = parseRange(range) {
            var ifRangeOK = true
            if let ir = recorded["if-range"] {
                ifRangeOK = (ir.hasPrefix("\"") && ir == r.etag && !(r.etag ?? "").hasPrefix("W/")) || (ir == r.lastModified)
            }
            if ifRangeOK {
                if first >= total {
                    headers.append(("Content-Range", "bytes */\(total)"))
                    return Plan(status: 416, headers: headers, body: [], fault: nil, rate: nil, logIndex: index)
                }
                var start = first
                if case .shiftContentRange(let k)? = fault { start = min(total - 1, first + k) }
                let end = min(last ?? (total - 1), total - 1)
                status = 206
                slice = r.body[start...end]
                if case .contentRange(let raw)? = fault {
                    headers.append(("Content-Range", raw))
                } else {
                    headers.append(("Content-Range", "bytes \(start)-\(end)/\(total)"))
                }
            }
        }
        if r.sendLength { headers.append(("Content-Length", "\(slice.count)")) } else { headers.append(("Connection", "close")) }
        var rate = r.bytesPerSecond
        if case .throttle(let bps)? = fault { rate = bps }
        if let slow = r.firstRangeBytesPerSecond, recorded["range"]?.hasPrefix("bytes=0-") == true { rate = slow }
        state.active[path, default: 0] += 1
        state.activeTotal += 1
        state.peakTotal = max(state.peakTotal, state.activeTotal)
        return Plan(status: status, headers: headers, body: slice, fault: fault, rate: rate, logIndex: index, path: path,
                    delay: r.firstByteDelay)
    }

    /// The entity tags of an `If-Match` list, each with its quotes (and `W/`): a comma inside
    /// quotes is part of its tag.
    static func entityTags(_ list: String) -> [String] {
        var tags: [String] = [], current = "", quoted = false
        for c in list {
            if c == "\"" { quoted.toggle() }
            if c == ",", !quoted {
                tags.append(current.trimmingCharacters(in: .whitespaces))
                current = ""
            } else {
                current.append(c)
            }
        }
        tags.append(current.trimmingCharacters(in: .whitespaces))
        return tags.filter { !$0.isEmpty }
    }

    static func parseRange(_ v: String) -> (Int, Int?)? {
        guard v.hasPrefix("bytes="), !v.contains(",") else { return nil }
        let parts = v.dropFirst(6).split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2, let first = Int(parts[0]) else { return nil }
        if parts[1].isEmpty { return (first, nil) }
        guard let last = Int(parts[1]), last >= first else { return nil }
        return (first, last)
    }

    func respond(context: ChannelHandlerContext, plan: Plan, keepAlive: Bool) {
        var headers = HTTPHeaders(plan.headers)
        if plan.body.isEmpty, !headers.contains(name: "Content-Length"), plan.status != 304 {
            headers.replaceOrAdd(name: "Content-Length", value: "0")
        } else if plan.status >= 300, plan.status != 304, !headers.contains(name: "Content-Length") {
            headers.replaceOrAdd(name: "Content-Length", value: "\(plan.body.count)")
        }
        let closeAfter = !keepAlive || headers["Connection"].first == "close"
        headers.add(name: "Date", value: "Sun, 22 Nov 2026 10:00:00 GMT")
        state.withLockedValue { $0.log[plan.logIndex].status = plan.status }
        context.channel.closeFuture.assumeIsolated().whenComplete { _ in self.finished(plan) }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .init(statusCode: plan.status), headers: headers))), promise: nil)
        var limit = plan.body.count
        switch plan.fault {
        case .dropAfter(let n)?, .stallAfter(let n)?: limit = min(n, plan.body.count)
        default: break
        }
        if let delay = plan.delay, limit > 0 {
            context.flush()
            context.eventLoop.assumeIsolated().scheduleTask(in: .nanoseconds(Int64(delay * 1e9))) {
                self.sendBody(context: context, plan: plan, from: plan.body.startIndex, limit: plan.body.startIndex + limit, closeAfter: closeAfter)
            }
            return
        }
        sendBody(context: context, plan: plan, from: plan.body.startIndex, limit: plan.body.startIndex + limit, closeAfter: closeAfter)
    }

    /// A response is over (sent, failed or its connection closed): counted once.
    func finished(_ plan: Plan) {
        guard !plan.path.isEmpty else { return }
        state.withLockedValue {
            if $0.closed.insert(plan.logIndex).inserted {
                $0.active[plan.path, default: 1] -= 1
                $0.activeTotal -= 1
            }
        }
    }

    func sendBody(context: ChannelHandlerContext, plan: Plan, from: Int, limit: Int, closeAfter: Bool) {
        let chunk = plan.rate.map { max(1024, min(65536, $0 / 20)) } ?? 65536
        if from >= limit {
            if case .stallAfter? = plan.fault {} else { finished(plan) }
            switch plan.fault {
            case .dropAfter?:
                context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(ByteBuffer()))), promise: nil)
                context.close(promise: nil)
            case .stallAfter?:
                context.flush()  // and never finish: the client must notice the stall
            default:
                context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in
                    if closeAfter { context.close(promise: nil) }
                }
            }
            return
        }
        if state.withLockedValue({ $0.held.contains(plan.path) }) {
            guard context.channel.isActive else { return finished(plan) }
            context.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(5)) {
                self.sendBody(context: context, plan: plan, from: from, limit: limit, closeAfter: closeAfter)
            }
            return
        }
        let end = min(limit, from + chunk)
        let buffer = context.channel.allocator.buffer(bytes: plan.body[from..<end])
        state.withLockedValue { $0.log[plan.logIndex].bytesSent += end - from }
        let written = context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(buffer))))
        written.assumeIsolated().whenComplete { result in
            guard case .success = result else {
                self.finished(plan)
                return
            }
            if let rate = plan.rate {
                let delay = TimeAmount.nanoseconds(Int64(Double(end - from) / Double(rate) * 1e9))
                context.eventLoop.assumeIsolated().scheduleTask(in: delay) {
                    self.sendBody(context: context, plan: plan, from: end, limit: limit, closeAfter: closeAfter)
                }
            } else {
                self.sendBody(context: context, plan: plan, from: end, limit: limit, closeAfter: closeAfter)
            }
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
