import NIOCore
import NIOPosix
import NIOSOCKS

/// Opens FTP's TCP connections along a request's ``FTPTransport/Route``: directly, through a
/// SOCKS5 proxy (NIOSOCKS's `SOCKSClientHandler`), or through an HTTP proxy's `CONNECT` tunnel.
/// The connection's own handlers sit behind the proxy's from the start, so no byte the server
/// sends right after the proxy connected it (an FTP greeting) is lost; a connection is handed
/// back only once the proxy has connected it, within the handshake bound. Never around the proxy.
enum FTPConnection {
    /// Where a request's connections go and how.
    struct Reach: Sendable {
        /// The host the proxy is asked to connect to (an IP address when the name was resolved
        /// here, for `socks5://`).
        var host: String
        let route: FTPTransport.Route
        /// The bound on the proxy's handshake (a SOCKS exchange, a CONNECT answer).
        let handshakeTimeout: TimeAmount
        let userAgent: String
    }

    /// A connection to `reach.host:port` (or, direct, to `direct` when given). `configure` sets
    /// the bootstrap's options; `handlers` adds the connection's own handlers (on its loop).
    static func open(_ reach: Reach, port: Int, direct: SocketAddress?, on loop: any EventLoop, timeout: TimeAmount, autoRead: Bool,
                     configure: (ClientBootstrap) -> ClientBootstrap,
                     handlers: @escaping @Sendable (ChannelPipeline.SynchronousOperations) throws -> Void) async throws -> any Channel {
        let ready = loop.makePromise(of: Void.self)
        let route = reach.route
        var socksTarget: SOCKSAddress? = nil
        if case .socks = route {
            // An address is sent as one (bounded: a port 1-65535 was checked where it was read).
            if let address = try? SocketAddress(ipAddress: reach.host, port: port) {
                socksTarget = .address(address)
            } else {
                socksTarget = .domain(reach.host, port: port)
            }
        }
        let target = socksTarget
        let host = reach.host, userAgent = reach.userAgent
        let bootstrap = configure(ClientBootstrap(group: loop).connectTimeout(timeout))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let ops = channel.pipeline.syncOperations
                    switch route {
                    case .direct:
                        ready.succeed(())
                    case .socks(let proxy):
                        try ops.addHandler(SOCKSClientHandler(targetAddress: target ?? .domain(host, port: port)))
                        try ops.addHandler(SOCKSReady(ready: ready, autoRead: autoRead, proxy: proxy))
                    case .tunnel(let proxy):
                        try ops.addHandler(FTPTunnelHandler(host: host, port: port, authorization: ProxyTransport.authorization(proxy),
                                                            userAgent: userAgent, ready: ready, autoRead: autoRead))
                    }
                    try handlers(ops)
                }
            }
        let channel: any Channel
        do {
            switch route {
            case .direct:
                if let direct {
                    channel = try await bootstrap.connect(to: direct).get()
                } else {
                    channel = try await bootstrap.connect(host: host, port: port).get()
                }
            case .socks(let proxy), .tunnel(let proxy):
                channel = try await bootstrap.connect(host: proxy.host, port: proxy.port).get()
            }
        } catch {
            ready.fail(error)
            throw HTTPClientTransport.classify(error, proxy: route.proxy)
        }
        guard let proxy = route.proxy else { return channel }
        let bound = reach.handshakeTimeout
        try await ProxyTransport.awaitHandshake(
            ready, on: channel, within: bound, proxy: proxy,
            timedOut: .transient("the proxy \(proxy) did not connect to the FTP server within \(bound.nanoseconds / 1_000_000_000) s"),
            closed: .transient("the proxy \(proxy) closed the connection before connecting to the FTP server"))
        return channel
    }
}

/// Behind NIOSOCKS's `SOCKSClientHandler`: completes `ready` when the proxy has connected the
/// channel (or fails it, in words), reads while the handshake needs it on a channel that does not
/// read by itself, then takes both handlers out of the pipeline.
final class SOCKSReady: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    let ready: EventLoopPromise<Void>
    let autoRead: Bool
    let proxy: ProxyURL
    private var done = false

    init(ready: EventLoopPromise<Void>, autoRead: Bool, proxy: ProxyURL) {
        self.ready = ready
        self.autoRead = autoRead
        self.proxy = proxy
    }

    func channelActive(context: ChannelHandlerContext) {
        context.fireChannelActive()
        if !autoRead { context.read() }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        context.fireChannelReadComplete()
        if !done, !autoRead { context.read() }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard !done, event is SOCKSProxyEstablishedEvent else { return context.fireUserInboundEventTriggered(event) }
        done = true
        ready.succeed(())
        let ops = context.pipeline.syncOperations
        if let socks = try? ops.handler(type: SOCKSClientHandler.self) { ops.removeHandler(socks, promise: nil) }
        ops.removeHandler(context: context, promise: nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !done {
            done = true
            ready.fail(Self.failure(error, proxy: proxy))
        }
        context.fireErrorCaught(error)
    }

    /// A SOCKS failure in words (RFC 1928's reply codes): the proxy's rules or its wish for a login
    /// are refusals, the rest worth a retry.
    static func failure(_ error: any Error, proxy: ProxyURL) -> TransportError {
        if error is SOCKSError.NoValidAuthenticationMethod {
            return .refused("the SOCKS proxy \(proxy) requires a login, which Pickup does not support")
        }
        guard let failed = error as? SOCKSError.ConnectionFailed else {
            if let known = error as? TransportError { return known }
            return .transient("the SOCKS proxy \(proxy) broke the protocol (\(error))")
        }
        let why: String
        switch failed.reply.value {
        case 1: why = "a failure of its own"
        case 2: return .refused("the SOCKS proxy \(proxy) refuses to connect to the FTP server (not allowed by its rules)")
        case 3: why = "network unreachable"
        case 4: why = "host unreachable"
        case 5: why = "connection refused"
        case 6: why = "TTL expired"
        case 7: why = "command not supported"
        case 8: why = "address type not supported"
        default: why = "reply \(failed.reply.value)"
        }
        return .transient("the SOCKS proxy \(proxy) could not connect to the FTP server: \(why)")
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !done {
            done = true
            ready.fail(TransportError.transient("the SOCKS proxy \(proxy) closed the connection before connecting to the FTP server"))
        }
        context.fireChannelInactive()
    }
}

/// A `CONNECT` tunnel for an FTP connection: sends the request, reads the proxy's answer (bounded
/// as ``TunnelHandler``'s), and on a 2xx tells the handlers behind it that the channel is active,
/// hands them what followed the answer and leaves; anything else is the proxy's refusal.
final class FTPTunnelHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let host: String
    let port: Int
    let authorization: String?
    let userAgent: String
    let ready: EventLoopPromise<Void>
    let autoRead: Bool
    private var received: ByteBuffer?
    private var done = false

    init(host: String, port: Int, authorization: String?, userAgent: String, ready: EventLoopPromise<Void>, autoRead: Bool) {
        self.host = host
        self.port = port
        self.authorization = authorization
        self.userAgent = userAgent
        self.ready = ready
        self.autoRead = autoRead
    }

    func channelActive(context: ChannelHandlerContext) {
        // The handlers behind learn that the channel is active once the tunnel is up.
        let text = TunnelHandler.request(host: host, port: port, authorization: authorization, userAgent: userAgent)
        context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(string: text)), promise: nil)
        if !autoRead { context.read() }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return context.fireChannelRead(data) }
        var bytes = unwrapInboundIn(data)
        received.setOrWriteBuffer(&bytes)
        guard let all = received else { return }
        let view = all.readableBytesView
        let end: Int
        switch TunnelHandler.answer(view) {
        case .incomplete: return
        case .failed(let error): return fail(error, context: context)
        case .up(let at): end = at
        }
        done = true
        received = nil
        var rest = all
        rest.moveReaderIndex(forwardBy: end - view.startIndex)
        context.fireChannelActive()
        if rest.readableBytes > 0 { context.fireChannelRead(wrapInboundOut(rest)) }
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        ready.succeed(())
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if done { return context.fireChannelReadComplete() }
        if !autoRead { context.read() }
    }

    private func fail(_ error: TransportError, context: ChannelHandlerContext) {
        done = true
        received = nil
        ready.fail(error)
        context.close(promise: nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !done {
            done = true
            ready.fail(error)
        }
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !done {
            done = true
            ready.fail(TransportError.transient("the proxy closed the connection during CONNECT"))
        }
        context.fireChannelInactive()
    }
}
