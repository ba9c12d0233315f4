import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOTLS
import X509

/// Requests through an HTTP proxy, on SwiftNIO's HTTP/1 codec (AsyncHTTPClient tunnels every
/// request with CONNECT, which most proxies allow to port 443 only).
///
/// - `http://` URLs go to the proxy in absolute form (`GET http://host/f HTTP/1.1`, RFC 9112
///   §3.2.2) with `Proxy-Authorization` when the proxy URL has credentials, over connections to
///   the proxy that are kept and reused for any origin.
/// - `https://` URLs (and `http://` ones with ``ProxyRules/tunnel``) go through a `CONNECT`
///   tunnel to their origin, TLS verified as for a direct connection; tunnels are kept per origin.
/// - A refusal by the proxy itself (a CONNECT answered with anything but 2xx; in absolute form a
///   407, or an error marked as the proxy's by `Proxy-Status` (RFC 9209) or `X-Squid-Error`) is
///   ``TransportError/proxyRefused(status:reason:)``, never a network failure.
///
/// The per-chunk path is the one of the direct transport: the body part's bytes go to the sink
/// through an existential call; reads are sized by the shared ``ReadBudget``; a speed limit's
/// pause turns reading off (`autoRead`) until a timer turns it on again. Stalls and slow heads are
/// caught by one timer per request that re-arms itself from the last read, not per chunk.
final class ProxyTransport: Sendable {
    struct Target: Hashable, Sendable {
        let host: String
        let port: Int
        let tls: Bool
    }

    /// Connections to one proxy in absolute form (`tunnel` nil), or tunnels to one origin.
    struct Key: Hashable, Sendable {
        let proxy: ProxyURL
        let tunnel: Target?
    }

    struct Idle {
        let channel: any Channel
        let handler: NIOLoopBound<ProxyClientHandler>
    }

    let loops: [any EventLoop]
    let tls: TLSConfiguration
    let sslContexts = NIOLockedValueBox<[Bool: NIOSSLContext]>([:])
    let connectTimeout: TimeAmount
    let headTimeout: TimeAmount
    let budget: ReadBudget
    let userAgent: String
    let idle = NIOLockedValueBox<[Key: [Idle]]>([:])
    let isShutDown = NIOLockedValueBox(false)
    /// Idle connections kept per key.
    static let maxIdle = 32

    init(loops: [any EventLoop], tls: TLSConfiguration, connectTimeout: Double, headTimeout: TimeAmount, budget: ReadBudget,
         userAgent: String) {
        self.loops = loops
        self.tls = tls
        self.connectTimeout = Seconds.timeAmount(connectTimeout)
        self.headTimeout = headTimeout
        self.budget = budget
        self.userAgent = userAgent
    }

    /// What one request needs to know about its URL.
    struct Parsed: Sendable {
        let target: Target
        /// `http://host[:port]/path?query` (absolute form) or `/path?query` (origin form).
        let absolute: String
        let origin: String
        /// `Host`: the host (bracketed when IPv6) and the port when not the scheme's default.
        let hostField: String
        let isIPAddress: Bool
    }

    static func parse(_ url: String) throws(TransportError) -> Parsed {
        // ftp:// goes to the proxy in absolute form only (its FTP gateway: Squid's), never tunnelled here.
        guard let c = URLComponents(string: url), let scheme = c.scheme?.lowercased(), ["http", "https", "ftp"].contains(scheme),
            let rawHost = c.percentEncodedHost ?? c.host, !rawHost.isEmpty
        else { throw .fatal("invalid URL \(DownloadURL.redacted(url))") }
        let bare = rawHost.hasPrefix("[") ? String(rawHost.dropFirst().dropLast()) : rawHost
        let tls = scheme == "https"
        let defaultPort = Origin.defaultPort(scheme)
        let port = c.port ?? defaultPort
        guard (1...65535).contains(port) else { throw .fatal("invalid URL \(DownloadURL.redacted(url))") }
        let uriHost = bare.contains(":") ? "[\(bare)]" : bare
        let hostField = port == defaultPort ? uriHost : "\(uriHost):\(port)"
        let path = c.percentEncodedPath.isEmpty ? "/" : c.percentEncodedPath
        let origin = path + (c.percentEncodedQuery.map { "?" + $0 } ?? "")
        return Parsed(target: Target(host: bare, port: port, tls: tls), absolute: "\(scheme)://\(hostField)\(origin)",
                      origin: origin, hostField: hostField, isIPAddress: DownloadURL.isIPAddress(bare))
    }

    /// Performs one request through `proxy`. `headers` are the request's fields (the transport's
    /// defaults and the engine's); `Host` and `Proxy-Authorization` are added here.
    func fetch(_ request: FetchRequest, headers: HTTPHeaders, via proxy: ProxyURL, tunnelAlways: Bool, stall: TimeAmount,
               into sink: some ResponseSink) async throws {
        let url = try Self.parse(request.url)
        let tunnel = (url.target.tls || tunnelAlways) && !url.absolute.hasPrefix("ftp:")
        let key = Key(proxy: proxy, tunnel: tunnel ? url.target : nil)
        var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: tunnel ? url.origin : url.absolute)
        head.headers.add(name: "Host", value: url.hostField)
        var fields = headers
        fields.remove(name: "Host")  // (NIO compares names without regard to case)
        fields.remove(name: "Proxy-Authorization")
        head.headers.add(contentsOf: fields)
        if !tunnel, let auth = Self.authorization(proxy) { head.headers.add(name: "Proxy-Authorization", value: auth) }
        let loop = request.lane.map { loops[$0 % loops.count] } ?? loops[Int.random(in: 0..<loops.count)]
        // A kept connection the proxy has closed meanwhile fails before any byte: once more on a new one.
        for attempt in 0..<2 {
            let reused = attempt == 0 ? take(key, preferring: loop) : nil
            let conn: Idle
            if let reused { conn = reused } else { conn = try await connect(key, url: url, on: loop) }
            do {
                try await exchange(on: conn, key: key, head: head, forward: !tunnel, stall: stall, sink: sink)
                return
            } catch is StaleConnection where reused != nil {
                continue
            } catch is StaleConnection {
                throw TransportError.transient("the proxy closed the connection before answering")
            }
        }
    }

    static func authorization(_ proxy: ProxyURL) -> String? {
        proxy.user.map { "Basic " + Data("\($0):\(proxy.password ?? "")".utf8).base64EncodedString() }
    }

    private func exchange(on conn: Idle, key: Key, head: HTTPRequestHead, forward: Bool, stall: TimeAmount,
                          sink: some ResponseSink) async throws {
        let channel = conn.channel
        let promise = channel.eventLoop.makePromise(of: Void.self)
        let exchange = ProxyClientHandler.Exchange(head: head, sink: sink, promise: promise, stall: stall,
                                                   headTimeout: headTimeout, forward: forward, batchReads: !(key.tunnel?.tls ?? false))
        let handler = conn.handler
        channel.eventLoop.execute {
            handler.value.start(exchange) { [weak self] in self?.release(Idle(channel: channel, handler: handler), key: key) }
        }
        try await withTaskCancellationHandler {
            try await promise.futureResult.get()
        } onCancel: {
            channel.eventLoop.execute { handler.value.fail(CancellationError()) }
        }
    }

    // MARK: connections

    private func take(_ key: Key, preferring loop: any EventLoop) -> Idle? {
        idle.withLockedValue { all -> Idle? in
            guard var list = all[key], !list.isEmpty else { return nil }
            defer { all[key] = list }
            list.removeAll { !$0.channel.isActive }
            let i = list.firstIndex { $0.channel.eventLoop === loop } ?? list.indices.last
            return i.map { list.remove(at: $0) }
        }
    }

    private func release(_ conn: Idle, key: Key) {
        let keep = idle.withLockedValue { all -> Bool in
            guard !isShutDown.withLockedValue({ $0 }), (all[key]?.count ?? 0) < Self.maxIdle else { return false }
            all[key, default: []].append(conn)
            return true
        }
        if keep {
            conn.channel.closeFuture.whenComplete { [weak self] _ in
                self?.idle.withLockedValue { all in all[key]?.removeAll { $0.channel === conn.channel } }
            }
        } else {
            conn.channel.close(promise: nil)
        }
    }

    private func sslContext(verifyHostname: Bool) throws -> NIOSSLContext {
        try sslContexts.withLockedValue { contexts in
            if let c = contexts[verifyHostname] { return c }
            var config = tls
            // A tunnel's peer address is the proxy's: an IP-literal origin is checked against the
            // certificate here (``TunnelIPCheck``), not by NIOSSL against the proxy's address.
            if !verifyHostname, config.certificateVerification == .fullVerification { config.certificateVerification = .noHostnameVerification }
            let c = try NIOSSLContext(configuration: config)
            contexts[verifyHostname] = c
            return c
        }
    }

    private func connect(_ key: Key, url: Parsed, on loop: any EventLoop) async throws -> Idle {
        let proxy = key.proxy
        let budget = self.budget
        let tunnelReady = loop.makePromise(of: Void.self)
        let bootstrap = ClientBootstrap(group: loop)
            .connectTimeout(connectTimeout)
            .channelOption(ChannelOptions.tcpOption(.tcp_nodelay), value: 1)
            .channelOption(ChannelOptions.recvAllocator, value: BudgetedRecvAllocator(budget: budget))
            .channelOption(ChannelOptions.maxMessagesPerRead, value: ReadBudget.readsPerWakeUp)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let client = ProxyClientHandler()
                    if let target = key.tunnel {
                        try channel.pipeline.syncOperations.addHandler(
                            TunnelHandler(target: target, authorization: Self.authorization(proxy), userAgent: self.userAgent,
                                          ready: tunnelReady, client: client, ssl: target.tls ? { verify in try self.sslContext(verifyHostname: verify) } : nil,
                                          ipLiteral: url.isIPAddress))
                    } else {
                        tunnelReady.succeed(())
                        try ProxyClientHandler.addHTTPHandlers(client, to: channel.pipeline.syncOperations, after: nil)
                    }
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: proxy.host, port: proxy.port).get()
        } catch {
            tunnelReady.fail(error)
            throw HTTPClientTransport.classify(error, proxy: proxy)
        }
        // The CONNECT answer within the head timeout.
        try await Self.awaitHandshake(
            tunnelReady, on: channel, within: headTimeout, proxy: proxy,
            timedOut: .protocolViolation("the proxy did not answer CONNECT within \(headTimeout.nanoseconds / 1_000_000_000) s"),
            closed: .transient("the proxy closed the connection during CONNECT"))
        let handler = try await channel.eventLoop.submit {
            NIOLoopBound(try channel.pipeline.syncOperations.handler(type: ProxyClientHandler.self), eventLoop: channel.eventLoop)
        }.get()
        return Idle(channel: channel, handler: handler)
    }

    func shutdown() {
        isShutDown.withLockedValue { $0 = true }
        let all = idle.withLockedValue { all in defer { all = [:] }; return all.values.flatMap { $0 } }
        for conn in all { conn.channel.close(promise: nil) }
    }
}

/// A kept connection that the proxy closed before answering (the request is sent again on a new one).
struct StaleConnection: Error {}

/// Records when bytes last arrived (for the stall timer), before any decoding.
final class ReadActivity: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    let client: ProxyClientHandler
    init(client: ProxyClientHandler) { self.client = client }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        client.lastRead = .now()
        client.receivedAny = true
        context.fireChannelRead(data)
    }
}

/// One request at a time on one connection: writes the head, hands the response to the sink,
/// and gives the connection back when the response ended cleanly and may be kept.
final class ProxyClientHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    struct Exchange: Sendable {
        let head: HTTPRequestHead
        let sink: any ResponseSink
        let promise: EventLoopPromise<Void>
        let stall: TimeAmount
        let headTimeout: TimeAmount
        /// Absolute form: a refusal can come from the proxy itself.
        let forward: Bool
        /// Whether reads may wait for a batch of the body (`SO_RCVLOWAT`): not under TLS, whose
        /// records do not map bytes on the wire to body bytes.
        let batchReads: Bool
    }

    /// A proxy forwards the body in small pieces (Squid: 16 KiB): woken for each, the process
    /// would spend more on wake-ups than on bytes, and the proxy, which shares the machine's cores
    /// on a LAN box or loopback, less. While at least this many body bytes are still to come, the
    /// socket wakes the loop only once this many are there (`SO_RCVLOWAT`; never more than what is
    /// left, so the end of a response is never held back). Through Squid on loopback, 1 GiB:
    /// 16 KiB reads 2.9-3.2 s, 64 KiB batches 2.9-3.0 s, 1 MiB batches 2.6-2.8 s (Benchmarks/README.md).
    static let readBatch = 1 << 20
    /// A sender slower than a batch within this long (a slow link, a trickling server) is read
    /// byte by byte again for the rest of the response.
    static let batchPatience = TimeAmount.seconds(1)
    private var remaining: Int64 = 0
    private var lowWater: Int32 = 1

    private var context: ChannelHandlerContext?
    private var exchange: Exchange?
    private var release: (() -> Void)?
    private var sent = NIODeadline.now()
    var lastRead = NIODeadline.now()
    var receivedAny = false
    private var gotHead = false
    private var keepAlive = false
    private var pause: Scheduled<Void>?
    private var watchdog: Scheduled<Void>?
    /// While the sink decides on the head, on ``BlockingIO`` (it may touch the file system, which
    /// an event loop must not): reading is off, the parts already decoded wait here, and an end
    /// that comes meanwhile (a cut, a stall) waits too, so the exchange never ends under it.
    private var headPending = false
    private var held: [HTTPClientResponsePart] = []
    private var endedWhilePending: (error: (any Error)?, keep: Bool)?

    static func addHTTPHandlers(_ client: ProxyClientHandler, to pipeline: ChannelPipeline.SynchronousOperations,
                                after: (any ChannelHandler)?) throws {
        let handlers: [any ChannelHandler] = [
            ReadActivity(client: client), HTTPRequestEncoder(),
            ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .dropBytes, informationalResponseStrategy: .drop)),
            client,
        ]
        if let after {
            var previous = after
            for h in handlers {
                try pipeline.addHandler(h, position: .after(previous))
                previous = h
            }
        } else {
            try pipeline.addHandlers(handlers)
        }
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    /// Sends the request. `release` gives the connection back for another request.
    func start(_ exchange: Exchange, release: @escaping () -> Void) {
        guard let context, context.channel.isActive else {
            exchange.promise.fail(StaleConnection())
            return
        }
        self.exchange = exchange
        self.release = release
        sent = .now()
        lastRead = sent
        receivedAny = false
        gotHead = false
        keepAlive = false
        remaining = 0
        setLowWater(1)
        context.write(wrapOutboundOut(.head(exchange.head)), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        arm(context, at: sent + min(exchange.stall, exchange.headTimeout))
    }

    /// Re-arms the timer that ends the request when no byte came for the stall timeout (or no
    /// complete head within the head timeout). Runs once per stall period, not per chunk.
    private func arm(_ context: ChannelHandlerContext, at deadline: NIODeadline) {
        watchdog?.cancel()
        watchdog = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [weak self] in
            guard let self, let exchange = self.exchange, let context = self.context else { return }
            let now = NIODeadline.now()
            if self.pause != nil {
                self.arm(context, at: now + exchange.stall)
                return
            }
            if self.lowWater > 1, now >= self.lastRead + Self.batchPatience {
                // Fewer bytes than a batch within a second: a slow sender. Wake for every byte
                // from now on in this response (what arrived meanwhile is read at once).
                self.setLowWater(1)
                self.remaining = 0
                self.lastRead = now
            }
            let stallAt = self.lastRead + exchange.stall
            let headAt = self.gotHead ? NIODeadline.distantFuture : self.sent + exchange.headTimeout
            if now >= headAt, now < stallAt || headAt <= stallAt {
                self.fail(TransportError.protocolViolation("no complete response head within \(exchange.headTimeout.nanoseconds / 1_000_000_000) s"))
            } else if now >= stallAt {
                self.fail(TransportError.stalled(seconds: Double(exchange.stall.nanoseconds) / 1e9))
            } else {
                let batchAt = self.lowWater > 1 ? self.lastRead + Self.batchPatience : NIODeadline.distantFuture
                self.arm(context, at: min(stallAt, headAt, batchAt))
            }
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        if headPending {
            held.append(part)
            return
        }
        receive(part, context: context)
    }

    private func receive(_ part: HTTPClientResponsePart, context: ChannelHandlerContext) {
        guard let exchange else { return }
        switch part {
        case .head(let head):
            gotHead = true
            keepAlive = head.isKeepAlive
            if exchange.batchReads, !head.headers[canonicalForm: "Transfer-Encoding"].contains(where: { $0.lowercased() == "chunked" }),
                let length = head.headers.first(name: "Content-Length").flatMap({ Int64($0) }), length > Int64(Self.readBatch) {
                remaining = length
                setLowWater(Int32(Self.readBatch))
                // The watchdog looks again within a second (see batchPatience).
                arm(context, at: min(lastRead + Self.batchPatience, lastRead + exchange.stall))
            }
            if exchange.forward, let refusal = Self.proxyRefusal(head) {
                fail(refusal)
                return
            }
            headPending = true
            context.channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in }
            let sink = exchange.sink
            let response = ResponseHead(status: Int(head.status.code), headers: head.headers.map { ($0.name, $0.value) })
            BlockingIO.head(on: context.eventLoop) { try sink.receiveHead(response) }
                .assumeIsolated().whenComplete { result in self.headDecided(result, context: context) }
        case .body(let buffer):
            if lowWater > 1 {
                remaining -= Int64(buffer.readableBytes)
                if remaining < Int64(lowWater) { setLowWater(Int32(clamping: max(1, remaining))) }
            }
            do {
                let seconds = try buffer.withUnsafeReadableBytes { try exchange.sink.receiveBody($0) }
                if seconds > 0, pause == nil {
                    // A speed limit: read nothing more until the bucket has refilled.
                    context.channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in }
                    pause = context.eventLoop.assumeIsolated().scheduleTask(in: Seconds.timeAmount(min(seconds, 86400))) { [weak self] in
                        self?.endPause()
                    }
                }
            } catch {
                fail(error)
            }
        case .end:
            finish(nil, keep: keepAlive)
        }
    }

    /// `SO_RCVLOWAT` on the socket (a system call only when it changes: a few times per response).
    private func setLowWater(_ bytes: Int32) {
        guard bytes != lowWater, let options = context?.channel.syncOptions else { return }
        lowWater = bytes
        try? options.setOption(ChannelOptions.socketOption(NIOBSDSocket.Option(rawValue: SO_RCVLOWAT)), value: Int(bytes))
    }

    /// The sink has decided on the head: the parts held meanwhile are taken in order (the end of
    /// a short response often came with its head), then an end that came meanwhile, else reading
    /// goes on.
    private func headDecided(_ result: Result<Void, any Error>, context: ChannelHandlerContext) {
        headPending = false
        let parts = held
        held = []
        let ended = endedWhilePending
        endedWhilePending = nil
        if case .failure(let error) = result { return fail(error) }
        // Reading goes on first: a response that ended among the held parts gives its connection
        // back for the next request, which must find it reading.
        if pause == nil { context.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in } }
        for part in parts where exchange != nil { receive(part, context: context) }
        if let ended { finish(ended.error, keep: ended.keep) }
    }

    private func endPause() {
        pause?.cancel()
        pause = nil
        lastRead = .now()
        context?.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if exchange != nil {
            fail(receivedAny ? TransportError.transient("the response ended early (the proxy closed the connection)") : StaleConnection())
        }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if exchange != nil { fail(HTTPClientTransport.classify(error)) }
        context.close(promise: nil)
    }

    /// Ends the request in progress with `error`; the connection is closed.
    func fail(_ error: any Error) { finish(error, keep: false) }

    private func finish(_ error: (any Error)?, keep: Bool) {
        guard let exchange else { return }
        if headPending {
            if endedWhilePending == nil { endedWhilePending = (error, keep) }
            return
        }
        self.exchange = nil
        watchdog?.cancel()
        watchdog = nil
        if pause != nil {
            pause?.cancel()
            pause = nil
            context?.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in }
        }
        let release = self.release
        self.release = nil
        // A kept connection's next response head must not wait for a batch.
        setLowWater(1)
        if let error {
            context?.close(promise: nil)
            exchange.promise.fail(error)
        } else {
            if keep { release?() } else { context?.close(promise: nil) }
            exchange.promise.succeed(())
        }
    }

    /// A response the proxy made itself, refusing: 407, or an error it marks as its own.
    static func proxyRefusal(_ head: HTTPResponseHead) -> TransportError? {
        let status = Int(head.status.code)
        guard status >= 400 else { return nil }
        let own = status == 407 || head.headers.contains(name: "X-Squid-Error")
            || head.headers["Proxy-Status"].contains { $0.lowercased().contains("error=") }
        return own ? .proxyRefused(status: status, reason: head.status.reasonPhrase) : nil
    }
}

/// Opens a CONNECT tunnel: sends the request, reads the proxy's answer (a 2xx, or its refusal),
/// then puts TLS (for https) and the HTTP codec in its place.
final class TunnelHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let target: ProxyTransport.Target
    let authorization: String?
    let userAgent: String
    let ready: EventLoopPromise<Void>
    let client: ProxyClientHandler
    let ssl: ((Bool) throws -> NIOSSLContext)?
    let ipLiteral: Bool
    private var received: ByteBuffer?
    static let maxAnswer = 16 << 10

    init(target: ProxyTransport.Target, authorization: String?, userAgent: String, ready: EventLoopPromise<Void>,
         client: ProxyClientHandler, ssl: ((Bool) throws -> NIOSSLContext)?, ipLiteral: Bool) {
        self.target = target
        self.authorization = authorization
        self.userAgent = userAgent
        self.ready = ready
        self.client = client
        self.ssl = ssl
        self.ipLiteral = ipLiteral
    }

    func channelActive(context: ChannelHandlerContext) {
        let text = Self.request(host: target.host, port: target.port, authorization: authorization, userAgent: userAgent)
        context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(string: text)), promise: nil)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        received.setOrWriteBuffer(&bytes)
        guard let all = received else { return }
        let view = all.readableBytesView
        let end: Int
        switch Self.answer(view) {
        case .incomplete: return
        case .failed(let error):
            ready.fail(error)
            context.close(promise: nil)
            return
        case .up(let at): end = at
        }
        // The tunnel is up: TLS (verified) and HTTP take this handler's place.
        do {
            let ops = context.pipeline.syncOperations
            var previous: any ChannelHandler = self
            if let ssl {
                let tlsHandler = try NIOSSLClientHandler(context: try ssl(!ipLiteral), serverHostname: ipLiteral ? nil : target.host)
                try ops.addHandler(tlsHandler, position: .after(self))
                previous = tlsHandler
                if ipLiteral {
                    let check = TunnelIPCheck(host: target.host)
                    try ops.addHandler(check, position: .after(tlsHandler))
                    previous = check
                }
            }
            try ProxyClientHandler.addHTTPHandlers(client, to: ops, after: previous)
            var rest = all
            rest.moveReaderIndex(forwardBy: end - view.startIndex)
            received = nil
            if rest.readableBytes > 0 { context.fireChannelRead(wrapInboundOut(rest)) }
            ops.removeHandler(context: context, promise: nil)
            ready.succeed(())
        } catch {
            ready.fail(error)
            context.close(promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        ready.fail(error)
        context.close(promise: nil)
    }

    /// The CONNECT request for `host:port` (an IPv6 literal in brackets).
    static func request(host: String, port: Int, authorization: String?, userAgent: String) -> String {
        let name = host.contains(":") ? "[\(host)]" : host
        var text = "CONNECT \(name):\(port) HTTP/1.1\r\nHost: \(name):\(port)\r\nUser-Agent: \(userAgent)\r\n"
        if let authorization { text += "Proxy-Authorization: \(authorization)\r\n" }
        return text + "\r\n"
    }

    /// What the proxy's answer to CONNECT says so far.
    enum Answer {
        case incomplete
        case failed(TransportError)
        /// The tunnel is up; the answer's head ends at `end` (what follows is the origin's).
        case up(end: Int)
    }

    /// Reads the proxy's answer to CONNECT (bounded to ``maxAnswer`` bytes): a 2xx is the tunnel.
    static func answer(_ view: ByteBufferView) -> Answer {
        guard let end = headEnd(view) else {
            return view.count > maxAnswer ? .failed(.protocolViolation("the proxy's answer to CONNECT is larger than 16 KiB")) : .incomplete
        }
        let (status, reason) = statusLine(view[view.startIndex..<end])
        guard let status else { return .failed(.protocolViolation("the proxy answered CONNECT with a malformed status line")) }
        guard (200..<300).contains(status) else { return .failed(.proxyRefused(status: status, reason: reason)) }
        return .up(end: end)
    }

    /// The index just past the blank line that ends a head, if there is one yet.
    static func headEnd(_ view: ByteBufferView) -> Int? {
        var i = view.startIndex
        while i + 3 < view.endIndex {
            if view[i] == 13, view[i + 1] == 10, view[i + 2] == 13, view[i + 3] == 10 { return i + 4 }
            i += 1
        }
        return nil
    }

    /// `HTTP/1.x SSS reason`: the status and a printable reason (the standard phrase when there is one).
    static func statusLine(_ head: ByteBufferView.SubSequence) -> (Int?, String) {
        let line = head.prefix { $0 != 13 && $0 != 10 }
        let parts = line.split(separator: 0x20, maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count >= 2, parts[0].starts(with: Array("HTTP/1.".utf8)), parts[1].count == 3,
            parts[1].allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
            let code = Int(String(decoding: parts[1], as: UTF8.self)), (100...599).contains(code)
        else { return (nil, "") }
        let standard = HTTPResponseStatus(statusCode: code).reasonPhrase
        if !standard.isEmpty, !standard.hasPrefix("<") { return (code, standard) }
        let sent = parts.count > 2 ? String(decoding: parts[2].prefix(64).filter { $0 >= 0x20 && $0 < 0x7F }, as: UTF8.self) : ""
        return (code, sent)
    }
}

/// Through a tunnel the peer's address is the proxy's, so NIOSSL cannot match an IP-literal
/// origin against the certificate: after the handshake the certificate must name that IP address.
final class TunnelIPCheck: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    let host: String
    init(host: String) { self.host = host }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case TLSUserEvent.handshakeCompleted? = event as? TLSUserEvent {
            let peer = try? context.pipeline.syncOperations.handler(type: NIOSSLClientHandler.self).peerCertificate
            if !Self.names(peer, ip: host) {
                context.fireErrorCaught(NIOSSLExtraError.failedToValidateHostname)
                context.close(promise: nil)
                return
            }
        }
        context.fireUserInboundEventTriggered(event)
    }

    static func names(_ certificate: NIOSSLCertificate?, ip: String) -> Bool {
        guard let der = try? certificate?.toDERBytes(), let cert = try? Certificate(derEncoded: der),
            let sans = try? cert.extensions.subjectAlternativeNames
        else { return false }
        var want: [UInt8]
        if let v4 = try? SocketAddress(ipAddress: ip, port: 0), case .v4(let a) = v4 {
            want = withUnsafeBytes(of: a.address.sin_addr) { Array($0) }
        } else if let v6 = try? SocketAddress(ipAddress: ip, port: 0), case .v6(let a) = v6 {
            want = withUnsafeBytes(of: a.address.sin6_addr) { Array($0) }
        } else {
            return false
        }
        return sans.contains { name in
            if case .ipAddress(let bytes) = name { return Array(bytes.bytes) == want }
            return false
        }
    }
}

extension ProxyTransport {
    /// Waits for a proxy's handshake on `channel` (a SOCKS exchange, a CONNECT answer) to complete
    /// `ready`, within `bound`: `timedOut` then, `closed` if the channel closes first. On failure or
    /// cancellation the channel is closed; errors are told as the proxy's (``HTTPClientTransport/classify(_:proxy:)``).
    static func awaitHandshake(_ ready: EventLoopPromise<Void>, on channel: any Channel, within bound: TimeAmount, proxy: ProxyURL,
                               timedOut: TransportError, closed: TransportError) async throws {
        let deadline = channel.eventLoop.scheduleTask(in: bound) { ready.fail(timedOut) }
        channel.closeFuture.whenComplete { _ in ready.fail(closed) }
        do {
            try await withTaskCancellationHandler {
                try await ready.futureResult.get()
            } onCancel: {
                channel.close(promise: nil)
            }
            deadline.cancel()
        } catch {
            deadline.cancel()
            channel.close(promise: nil)
            try Task.checkCancellation()
            throw HTTPClientTransport.classify(error, proxy: proxy)
        }
    }
}
