import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A server that answers every request with bytes given verbatim, not HTTP built by NIO: for
/// responses no well-behaved server sends (malformed or oversized heads, a head sent byte by
/// byte). It reads the request head, then writes `response` in pieces of `chunk` bytes, `interval`
/// apart, and closes the connection.
public final class RawServer: Sendable {
    let channel: any Channel
    let group: MultiThreadedEventLoopGroup
    /// The port it listens on (127.0.0.1).
    public let port: Int
    private let served: NIOLockedValueBox<Int>
    /// Set by ``stop()``: its loop is gone, and `deinit` must not schedule on it.
    private let stopped = NIOLockedValueBox(false)

    /// Requests answered so far.
    public var requests: Int { served.withLockedValue { $0 } }

    /// `http://127.0.0.1:PORT` + `path`.
    public func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    /// Starts listening on a free loopback port.
    public static func start(response: [UInt8], chunk: Int = 1 << 20, interval: TimeAmount = .zero) async throws -> RawServer {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let served = NIOLockedValueBox(0)
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        RawHandler(response: response, chunk: max(1, chunk), interval: interval, served: served))
                }
            }
        let channel = try await Ports.bindNew { try await bootstrap.bind(host: "127.0.0.1", port: 0).get() }
        return RawServer(channel: channel, group: group, port: channel.localAddress?.port ?? 0, served: served)
    }

    private init(channel: any Channel, group: MultiThreadedEventLoopGroup, port: Int, served: NIOLockedValueBox<Int>) {
        self.channel = channel
        self.group = group
        self.port = port
        self.served = served
    }

    /// Stops listening and closes every connection.
    public func stop() async {
        guard !stopped.withLockedValue({ s in defer { s = true }; return s }) else { return }
        try? await channel.close()
        try? await group.shutdownGracefully()
    }

    /// Released without ``stop()`` (a test that threw before it): the same, queued, nothing waits here.
    deinit {
        guard !stopped.withLockedValue({ $0 }) else { return }
        channel.close(promise: nil)
        group.shutdownGracefully { _ in }
    }
}

final class RawHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let response: [UInt8]
    let chunk: Int
    let interval: TimeAmount
    let served: NIOLockedValueBox<Int>
    var request: [UInt8] = []
    var answering = false

    init(response: [UInt8], chunk: Int, interval: TimeAmount, served: NIOLockedValueBox<Int>) {
        self.response = response
        self.chunk = chunk
        self.interval = interval
        self.served = served
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answering else { return }
        var buffer = unwrapInboundIn(data)
        request += buffer.readBytes(length: buffer.readableBytes) ?? []
        let end: [UInt8] = Array("\r\n\r\n".utf8)
        guard request.count >= 4, (0...(request.count - 4)).contains(where: { Array(request[$0..<$0 + 4]) == end }) else { return }
        answering = true
        served.withLockedValue { $0 += 1 }
        send(context: context, from: 0)
    }

    func send(context: ChannelHandlerContext, from: Int) {
        guard from < response.count else {
            context.close(promise: nil)
            return
        }
        let end = min(response.count, from + chunk)
        let written = context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(bytes: response[from..<end])))
        written.assumeIsolated().whenComplete { result in
            guard case .success = result else { return }
            if self.interval == .zero {
                self.send(context: context, from: end)
            } else {
                context.eventLoop.assumeIsolated().scheduleTask(in: self.interval) { self.send(context: context, from: end) }
            }
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
