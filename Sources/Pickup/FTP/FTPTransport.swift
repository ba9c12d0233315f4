import Foundation
import HTTPTypes
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSOCKS
import NIOSSL
import NIOTLS

/// FTP behind the engine's ``Transport``: each request is one control connection (login, `TYPE I`,
/// `SIZE`, `MDTM`, `EPSV` or `PASV`, `REST`, `RETR`) and one data connection, and its answer is
/// told to the sink as the HTTP response a server with the same file would give, so that the
/// engine's decisions (ranges, validators, several connections, never splicing) apply unchanged:
///
/// - the validator is `SIZE` and `MDTM` together, as a strong ETag `"ftp-MDTM-SIZE"` (none when the
///   server has no `MDTM`: then, as for HTTP without a validator, a resume only within a run);
/// - `Range: bytes=a-b` is `REST a` and reading `b - a + 1` bytes (then both connections are
///   closed), answered as a 206 with its `Content-Range`; `If-Range` that does not match the file's
///   validator, or a server that refuses `REST`, is answered as a 200 from byte 0;
/// - a missing file (550), a directory, a refused login (530) are ``TransportError/refused(_:)``;
///   "too many connections" (421, some servers' 530) is ``TransportError/busy(_:)`` (one connection
///   fewer); other 4xx replies are retried.
///
/// `ftps://` is explicit TLS (RFC 4217): `AUTH TLS`, `PBSZ 0`, `PROT P`, both connections verified
/// as https is (the same trust roots, `--insecure`). A server that requires the data connection to
/// resume the control connection's TLS session (vsftpd's `require_ssl_reuse`) is refused in words:
/// SwiftNIO's TLS has no session resumption to offer.
///
/// The data connection goes to the control connection's peer address, whatever a `PASV` reply
/// names. Its bytes take the per-chunk path of HTTP: the sink's `receiveBody` on the loop, reads
/// sized by the shared ``ReadBudget``, a speed limit's pause turning reading off.
///
/// Through a proxy (``Route``) both connections go through it, never around it: a SOCKS5 proxy
/// connects each to the URL's host (the data connection to the `EPSV`/`PASV` port), or an HTTP
/// proxy opens a `CONNECT` tunnel for each (`--proxytunnel`). An HTTP proxy in absolute form
/// (`GET ftp://host/path`, Squid's FTP gateway) is not this type's: ``ProxyTransport`` sends those.
final class FTPTransport: Sendable {
    let loops: [any EventLoop]
    let connectTimeout: TimeAmount
    let replyTimeout: TimeAmount
    let budget: ReadBudget
    let tls: TLSConfiguration
    let userAgent: String
    let sslContext = NIOLockedValueBox<NIOSSLContext?>(nil)

    /// How a request's connections reach the server.
    enum Route: Sendable, Equatable {
        case direct
        /// Each connection through this SOCKS5 proxy.
        case socks(ProxyURL)
        /// Each connection through a `CONNECT` tunnel of this HTTP proxy.
        case tunnel(ProxyURL)

        var proxy: ProxyURL? {
            switch self {
            case .direct: nil
            case .socks(let p), .tunnel(let p): p
            }
        }
    }

    init(loops: [any EventLoop], connectTimeout: Double, replyTimeout: TimeAmount, budget: ReadBudget, tls: TLSConfiguration,
         userAgent: String = "pickup/\(PickupVersion.string)") {
        self.loops = loops
        self.connectTimeout = Seconds.timeAmount(connectTimeout)
        self.replyTimeout = replyTimeout
        self.budget = budget
        self.tls = tls
        self.userAgent = userAgent
    }

    func context() throws -> NIOSSLContext {
        try sslContext.withLockedValue { c in
            if let c { return c }
            let made = try NIOSSLContext(configuration: tls)
            c = made
            return made
        }
    }

    /// What a request names: where, who, which file.
    struct Target: Sendable {
        let host: String
        let port: Int
        let user: String
        let password: String
        /// The path as the server is asked for it (percent-decoded; relative to the login directory).
        let path: String
        /// `ftps://`: explicit TLS on both connections.
        let secure: Bool
        /// The name TLS checks the certificate against (nil for an IP address: then the address).
        var serverName: String? { DownloadURL.isIPAddress(host) ? nil : host }
    }

    /// Parses an `ftp://` URL; credentials come from `Authorization: Basic` (the engine turns URL
    /// credentials, `-u` and `.netrc` into it, for this origin only), else anonymous.
    static func target(_ url: String, headers: HTTPFields) throws(TransportError) -> Target {
        guard let c = URLComponents(string: url), let scheme = c.scheme?.lowercased(), scheme == "ftp" || scheme == "ftps",
            let rawHost = c.host, !rawHost.isEmpty
        else { throw .fatal("invalid URL \(DownloadURL.redacted(url))") }
        let host = rawHost.hasPrefix("[") ? String(rawHost.dropFirst().dropLast()) : rawHost
        let port = c.port ?? Origin.defaultPort(scheme)
        guard (1...65535).contains(port) else { throw .fatal("invalid URL \(DownloadURL.redacted(url))") }
        var path = c.path  // percent-decoded
        if path.hasPrefix("/") { path.removeFirst() }
        // A command is one line: a path with CR, LF or NUL would smuggle another.
        guard !path.isEmpty, !path.utf8.contains(where: { $0 == 0 || $0 == 10 || $0 == 13 }), path.utf8.count <= 4096 else {
            throw .fatal("unusable FTP path in \(DownloadURL.redacted(url))")
        }
        var user = "anonymous", password = "anonymous@"
        if let auth = headers[values: .authorization].first,
            auth.lowercased().hasPrefix("basic "), let data = Data(base64Encoded: String(auth.dropFirst(6)).trimmingCharacters(in: .whitespaces)),
            let text = String(data: data, encoding: .utf8), let colon = text.firstIndex(of: ":")
        {
            user = String(text[..<colon])
            password = String(text[text.index(after: colon)...])
        }
        guard !(user + password).utf8.contains(where: { $0 == 0 || $0 == 10 || $0 == 13 }) else {
            throw .fatal("an FTP user name or password cannot hold line breaks")
        }
        return Target(host: host, port: port, user: user, password: password, path: path, secure: scheme == "ftps")
    }

    /// The byte range (nil without a `Range` the engine wrote: `bytes=a-` or `bytes=a-b`) and `If-Range`.
    static func range(_ headers: HTTPFields) -> (range: (first: Int64, last: Int64?)?, ifRange: String?) {
        let ifRange = headers[values: .ifRange].first
        guard let raw = headers[values: .range].first, raw.hasPrefix("bytes=") else {
            return (nil, ifRange)
        }
        let parts = raw.dropFirst(6).split(separator: "-", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2, let first = ContentRange.digits(parts[0]) else { return (nil, ifRange) }
        if parts[1].isEmpty { return ((first, nil), ifRange) }
        guard let last = ContentRange.digits(parts[1]), last >= first else { return (nil, ifRange) }
        return ((first, last), ifRange)
    }

    func fetch<Sink: ResponseSink>(_ request: FetchRequest, route: Route = .direct, into sink: Sink, stall: TimeAmount) async throws {
        let target = try Self.target(request.url, headers: request.headers)
        let (range, ifRange) = Self.range(request.headers)
        let loop = request.lane.map { loops[$0 % loops.count] } ?? loops[Int.random(in: 0..<loops.count)]
        var reach = FTPConnection.Reach(host: target.host, route: route, handshakeTimeout: replyTimeout, userAgent: userAgent)
        if case .socks(let proxy) = route, !proxy.resolvesAtProxy, !DownloadURL.isIPAddress(target.host) {
            // socks5:// (not socks5h://): the name is resolved here and the proxy is given the address,
            // once for both connections. On the blocking pool: getaddrinfo blocks (its own resolver
            // timeouts bound it).
            let host = target.host, port = target.port
            let resolved = try? await BlockingIO.run { try SocketAddress.makeAddressResolvingHost(host, port: port) }
            guard let ip = resolved?.ipAddress else { throw TransportError.unresolved(host: host) }
            reach.host = ip
        }
        let control = try await FTPControl.connect(reach, port: target.port, on: loop, timeout: connectTimeout,
                                                   replyTimeout: replyTimeout, budget: budget)
        defer { control.close() }
        do {
            try await withTaskCancellationHandler {
                try await session(control, reach: reach, target: target, range: range, ifRange: ifRange, stall: stall, sink: sink)
            } onCancel: {
                control.close()
            }
        } catch let e as TransportError {
            throw Self.hidingLogin(e, of: target)
        }
    }

    /// The error with the login's user name and password (a server may repeat them in its reply)
    /// replaced by `***`: neither is ever shown.
    static func hidingLogin(_ error: TransportError, of target: Target) -> TransportError {
        func hide(_ text: String) -> String {
            var text = text
            for secret in [target.password, target.user] where secret.count >= 3 && !["anonymous", "anonymous@", "ftp"].contains(secret) {
                text = text.replacingOccurrences(of: secret, with: "***")
            }
            return text
        }
        switch error {
        case .transient(let m): return .transient(hide(m))
        case .fatal(let m): return .fatal(hide(m))
        case .protocolViolation(let m): return .protocolViolation(hide(m))
        case .refused(let m): return .refused(hide(m))
        case .busy(let m): return .busy(hide(m))
        case .unresolved, .stalled, .proxyRefused: return error
        }
    }

    private func session<Sink: ResponseSink>(_ control: FTPControl, reach: FTPConnection.Reach, target: Target,
                                             range: (first: Int64, last: Int64?)?, ifRange: String?, stall: TimeAmount,
                                             sink: Sink) async throws {
        var reply = try await control.reply()
        guard reply.code == 220 else { throw Self.failure(reply, doing: "connecting") }
        if target.secure {
            reply = try await control.send("AUTH TLS")
            guard reply.code == 234 else {
                if reply.kind == 4 { throw Self.failure(reply, doing: "starting TLS") }
                throw TransportError.refused("the FTP server does not offer TLS (AUTH TLS: \(reply.summary))")
            }
            try await control.startTLS(try context(), serverName: target.serverName)
            for command in ["PBSZ 0", "PROT P"] {
                reply = try await control.send(command)
                guard reply.kind == 2 else { throw Self.failure(reply, doing: "protecting the data connection (\(command))") }
            }
        }
        reply = try await control.send("USER \(target.user)")
        if reply.code == 331 { reply = try await control.send("PASS \(target.password)", shown: "PASS ***") }
        guard reply.code == 230 || reply.code == 202 else {
            // A refusal for too many sessions (some servers say it with 530) is the server being
            // busy, not the login being wrong: one connection fewer (or, alone, retried).
            if reply.code == 421 || reply.kind == 4 || Self.saysTooMany(reply) {
                throw Self.failure(reply, doing: "logging in")
            }
            // The user name is a secret as the password is (a token, often): never shown.
            throw TransportError.refused("the FTP server refused the login as \(target.user == "anonymous" ? "anonymous" : "***") (\(reply.summary))")
        }
        reply = try await control.send("TYPE I")
        guard reply.kind == 2 else { throw Self.failure(reply, doing: "switching to binary mode") }
        reply = try await control.send("SIZE \(target.path)")
        var size: Int64? = nil
        if reply.code == 213 {
            size = FTPText.size(reply)
        } else if reply.code == 550 {
            let cwd = try await control.send("CWD \(target.path)")
            if cwd.kind == 2 { throw TransportError.refused("\(target.path) is a directory on the FTP server, not a file") }
            throw TransportError.refused("no such file on the FTP server: \(target.path) (\(reply.summary))")
        } else if reply.code == 421 || reply.kind == 4 {
            throw Self.failure(reply, doing: "asking for the size")
        }
        reply = try await control.send("MDTM \(target.path)")
        let mdtm = reply.code == 213 ? FTPText.mdtm(reply) : nil
        let etag = mdtm.map { "\"ftp-\($0)-\(size ?? -1)\"" }

        // Answer as an HTTP server with this file would: a head, decided by the sink on
        // BlockingIO's head threads (its decision may touch the file system).
        func answer(_ status: Int, _ fields: [(String, String)]) async throws {
            let head = ResponseHead(status: status, headers: fields)
            try await BlockingIO.head { try sink.receiveHead(head) }
        }
        let headers: [(String, String)] = etag.map { [("ETag", $0)] } ?? []
        // Ranges need the length; a validator that does not match means the whole file.
        let ranged = range != nil && size != nil && (ifRange == nil || ifRange == etag)
        if ranged, let size, let range, range.first >= size {
            try await answer(416, headers + [("Content-Range", "bytes */\(size)")])
            return
        }
        var start = ranged ? range?.first ?? 0 : 0

        let dataPort = try await passivePort(control)
        if start > 0 {
            let rest = try await control.send("REST \(start)")
            if rest.code != 350 {
                if rest.code == 421 { throw Self.failure(rest, doing: "resuming") }
                start = 0  // no restart: the whole file, as a server without ranges
            }
        }
        // The answer's head first: when it says all there is to know (a finished file's check that
        // finds the same validator and length), the sink stops here and nothing is transferred.
        let end: Int64?  // one past the last byte this answer sends
        if ranged, let size, let range, start == range.first {
            let lastByte = min(range.last ?? (size - 1), size - 1)
            end = lastByte + 1
            try await answer(206, headers + [("Content-Range", "bytes \(start)-\(lastByte)/\(size)"), ("Content-Length", "\(lastByte + 1 - start)")])
        } else {
            end = size
            try await answer(200, headers + (size.map { [("Content-Length", "\($0)")] } ?? []))
        }
        let data = try await FTPData.connect(reach, direct: control.peer, port: dataPort, on: control.channel.eventLoop,
                                             timeout: connectTimeout, budget: budget,
                                             tls: target.secure ? (try context(), target.serverName) : nil)
        defer { data.close() }
        reply = try await control.send("RETR \(target.path)")
        guard reply.kind == 1 || reply.kind == 2 else {
            if reply.code == 550 { throw TransportError.refused("the FTP server refused to send \(target.path) (\(reply.summary))") }
            throw Self.failure(reply, doing: "starting the transfer")
        }
        let wanted = end.map { $0 - start }
        let received = try await data.stream(into: sink, limit: wanted, stall: stall)
        if let wanted, received < wanted {
            // The control connection may say why (briefly: a silent server is not waited for).
            if let why = try? await control.reply(within: .seconds(2)), why.kind == 5 || why.code == 425 || why.code == 426 {
                if why.code == 522 || why.text.lowercased().contains("reuse") {
                    throw TransportError.refused("the FTP server requires the data connection to resume the control connection's TLS "
                        + "session (\(why.summary); vsftpd's require_ssl_reuse), which SwiftNIO's TLS cannot do; the server must allow it "
                        + "(require_ssl_reuse=NO)")
                }
                if why.kind == 5 { throw TransportError.refused("the FTP server stopped the transfer: \(why.summary)") }
            }
            throw TransportError.transient("the FTP data connection ended after \(received) of \(wanted) bytes")
        }
        if wanted == nil {
            // Without a length the end of the data is the end of the file only if the server says so.
            let done = try await control.reply()
            guard done.kind == 2 else { throw Self.failure(done, doing: "finishing the transfer") }
        }
    }

    /// `EPSV`, else `PASV`: the port of the data connection.
    private func passivePort(_ control: FTPControl) async throws -> Int {
        let epsv = try await control.send("EPSV")
        if epsv.code == 229, let port = FTPText.epsvPort(epsv) { return port }
        if epsv.code == 421 { throw Self.failure(epsv, doing: "opening a data connection") }
        let pasv = try await control.send("PASV")
        if pasv.code == 227, let port = FTPText.pasvPort(pasv) { return port }
        throw Self.failure(pasv, doing: "opening a data connection")
    }

    /// A reply that ends a request: "too many connections" (421, or 530 from some servers) is the
    /// server's limit on sessions, other 4xx are worth a retry, anything else is the server's refusal.
    static func failure(_ reply: FTPReply, doing what: String) -> TransportError {
        let message = "the FTP server answered \(reply.summary) while \(what)"
        if saysTooMany(reply) { return .busy(message) }
        return reply.kind == 4 || reply.kind == 1 ? .transient(message) : .refused(message)
    }

    /// Whether a refusal is about the number of sessions (`421 Too many connections from the same
    /// IP address`, `530 Sorry, the maximum number of clients is reached`).
    static func saysTooMany(_ reply: FTPReply) -> Bool {
        guard reply.kind == 4 || reply.code == 530 else { return false }
        let text = reply.text.lowercased()
        return ["too many", "maximum number", "limit"].contains(where: text.contains)
    }
}

/// The control connection: commands out, replies in, each reply awaited within a bound.
final class FTPControl: Sendable {
    let channel: any Channel
    let handler: NIOLoopBound<FTPControlHandler>
    let replyTimeout: TimeAmount
    /// The server's address: where the data connection goes.
    let peer: SocketAddress

    init(channel: any Channel, handler: NIOLoopBound<FTPControlHandler>, replyTimeout: TimeAmount, peer: SocketAddress) {
        self.channel = channel
        self.handler = handler
        self.replyTimeout = replyTimeout
        self.peer = peer
    }

    static func connect(_ reach: FTPConnection.Reach, port: Int, on loop: any EventLoop, timeout: TimeAmount, replyTimeout: TimeAmount,
                        budget: ReadBudget) async throws -> FTPControl {
        // The handler is held from the start: a server that greets with 421 and hangs up at once
        // leaves a closed channel with no pipeline to look it up in, and the reply is in it.
        let added = loop.makePromise(of: NIOLoopBound<FTPControlHandler>.self)
        let channel: any Channel
        do {
            channel = try await FTPConnection.open(reach, port: port, direct: nil, on: loop, timeout: timeout, autoRead: true, configure: {
                $0.channelOption(ChannelOptions.tcpOption(.tcp_nodelay), value: 1)
            }) { ops in
                let handler = FTPControlHandler()
                try ops.addHandler(ByteToMessageHandler(FTPLineDecoder()))
                try ops.addHandler(handler)
                added.succeed(NIOLoopBound(handler, eventLoop: loop))
            }
        } catch {
            added.fail(error)  // unless it was added
            throw error
        }
        added.fail(TransportError.transient("the FTP control connection has no handler"))  // unless it was added
        let handler = try await added.futureResult.get()
        // The address as the connection saw it when it opened (a closed channel no longer knows it).
        let address = try await channel.eventLoop.submit { handler.value.peer ?? channel.remoteAddress }.get()
        guard let peer = address else {
            channel.close(promise: nil)
            throw TransportError.transient("the FTP control connection has no peer address")
        }
        return FTPControl(channel: channel, handler: handler, replyTimeout: replyTimeout, peer: peer)
    }

    /// Puts TLS under the control connection (after `AUTH TLS`), verified against `serverName`
    /// (or the peer's address); returns once the handshake is done, within the reply timeout.
    func startTLS(_ context: NIOSSLContext, serverName: String?) async throws {
        let done = channel.eventLoop.makePromise(of: Void.self)
        let channel = self.channel
        let deadline = channel.eventLoop.scheduleTask(in: replyTimeout) {
            done.fail(TransportError.transient("no TLS handshake with the FTP server within \(self.replyTimeout.nanoseconds / 1_000_000_000) s"))
            channel.close(promise: nil)
        }
        defer { deadline.cancel() }
        channel.eventLoop.execute {
            do {
                let tls = try NIOSSLClientHandler(context: context, serverHostname: serverName)
                try channel.pipeline.syncOperations.addHandler(tls, position: .first)
                try channel.pipeline.syncOperations.addHandler(TLSReady(done), position: .after(tls))
            } catch {
                done.fail(error)
            }
        }
        do {
            try await done.futureResult.get()
        } catch {
            throw HTTPClientTransport.classify(error)
        }
    }

    /// The next reply (1xx included), within the reply timeout (or `within`).
    func reply(within: TimeAmount? = nil) async throws -> FTPReply {
        let promise = channel.eventLoop.makePromise(of: FTPReply.self)
        let handler = self.handler, timeout = within ?? replyTimeout
        channel.eventLoop.execute { handler.value.next(promise, within: timeout) }
        return try await promise.futureResult.get()
    }

    /// Sends a command and returns its first reply. `shown` is how it may appear in an error.
    func send(_ command: String, shown: String? = nil) async throws -> FTPReply {
        var buffer = channel.allocator.buffer(capacity: command.utf8.count + 2)
        buffer.writeString(command)
        buffer.writeString("\r\n")
        do {
            try await channel.writeAndFlush(buffer)
        } catch {
            throw TransportError.transient("the FTP server closed the control connection (sending \((shown ?? command).prefix(4)))")
        }
        return try await reply()
    }

    func close() { channel.close(promise: nil) }
}

/// Lines of the control channel: split at LF (a CR before it dropped), each at most 8 KiB.
struct FTPLineDecoder: ByteToMessageDecoder {
    typealias InboundOut = String
    static let maxLine = 8192

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let view = buffer.readableBytesView
        guard let lf = view.firstIndex(of: 10) else {
            if buffer.readableBytes > Self.maxLine { throw TransportError.protocolViolation("an FTP reply line is longer than 8 KiB") }
            return .needMoreData
        }
        let length = lf - view.startIndex
        guard length <= Self.maxLine else { throw TransportError.protocolViolation("an FTP reply line is longer than 8 KiB") }
        var bytes = buffer.readBytes(length: length) ?? []
        buffer.moveReaderIndex(forwardBy: 1)
        if bytes.last == 13 { bytes.removeLast() }
        context.fireChannelRead(wrapInboundOut(String(decoding: bytes, as: UTF8.self)))
        return .continue
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        return .needMoreData
    }
}

/// Assembles replies and hands each to the one waiting for it, in order.
final class FTPControlHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = String
    private var parser = FTPReplyParser()
    private var ready: [FTPReply] = []
    private var waiting: (promise: EventLoopPromise<FTPReply>, deadline: Scheduled<Void>)?
    private var failure: (any Error)?
    private var context: ChannelHandlerContext?

    /// The server's address, kept from when the connection opened.
    private(set) var peer: SocketAddress?

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func channelActive(context: ChannelHandlerContext) {
        peer = context.channel.remoteAddress
        context.fireChannelActive()
    }

    func next(_ promise: EventLoopPromise<FTPReply>, within timeout: TimeAmount) {
        if !ready.isEmpty { return promise.succeed(ready.removeFirst()) }
        if let failure { return promise.fail(failure) }
        guard let context else { return promise.fail(TransportError.transient("the FTP control connection is closed")) }
        let deadline = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) { [weak self] in
            self?.fail(TransportError.transient("no reply from the FTP server within \(timeout.nanoseconds / 1_000_000_000) s"))
            self?.context?.close(promise: nil)
        }
        waiting = (promise, deadline)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        do {
            guard let reply = try parser.feed(unwrapInboundIn(data)) else { return }
            guard ready.count < 16 else { throw TransportError.protocolViolation("the FTP server sent replies nobody asked for") }
            if let (promise, deadline) = waiting {
                waiting = nil
                deadline.cancel()
                promise.succeed(reply)
            } else {
                ready.append(reply)
            }
        } catch let e as FTPReplyParser.Failure {
            fail(TransportError.protocolViolation("a malformed FTP reply (\(e))"))
            context.close(promise: nil)
        } catch {
            fail(error)
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        fail(TransportError.transient("the FTP server closed the control connection"))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(HTTPClientTransport.classify(error))
        context.close(promise: nil)
    }

    private func fail(_ error: any Error) {
        if failure == nil { failure = error }
        if let (promise, deadline) = waiting {
            waiting = nil
            deadline.cancel()
            promise.fail(error)
        }
    }
}

/// The data connection: its bytes go to the sink until `limit` bytes or the end.
final class FTPData: Sendable {
    let channel: any Channel
    let handler: NIOLoopBound<FTPDataHandler>

    init(channel: any Channel, handler: NIOLoopBound<FTPDataHandler>) {
        self.channel = channel
        self.handler = handler
    }

    /// A data connection to `port`: of the control connection's peer when direct, else of the host
    /// the proxy reaches.
    static func connect(_ reach: FTPConnection.Reach, direct peer: SocketAddress, port: Int, on loop: any EventLoop, timeout: TimeAmount,
                        budget: ReadBudget, tls: (NIOSSLContext, String?)?) async throws -> FTPData {
        var address = peer
        address.port = port
        let channel = try await FTPConnection.open(reach, port: port, direct: address, on: loop, timeout: timeout, autoRead: false, configure: {
            $0.channelOption(ChannelOptions.autoRead, value: false)
                .channelOption(ChannelOptions.recvAllocator, value: BudgetedRecvAllocator(budget: budget))
                .channelOption(ChannelOptions.maxMessagesPerRead, value: ReadBudget.readsPerWakeUp)
        }) { ops in
            if let (context, name) = tls {
                try ops.addHandler(try NIOSSLClientHandler(context: context, serverHostname: name))
            }
            try ops.addHandler(FTPDataHandler())
        }
        let handler = try await channel.eventLoop.submit {
            NIOLoopBound(try channel.pipeline.syncOperations.handler(type: FTPDataHandler.self), eventLoop: channel.eventLoop)
        }.get()
        return FTPData(channel: channel, handler: handler)
    }

    /// Streams the data into `sink`; returns the bytes received (at most `limit`).
    func stream<Sink: ResponseSink>(into sink: Sink, limit: Int64?, stall: TimeAmount) async throws -> Int64 {
        let promise = channel.eventLoop.makePromise(of: Int64.self)
        let handler = self.handler
        channel.eventLoop.execute { handler.value.start(sink: sink, limit: limit, stall: stall, promise: promise) }
        return try await withTaskCancellationHandler {
            try await promise.futureResult.get()
        } onCancel: {
            self.channel.eventLoop.execute { handler.value.finish(CancellationError()) }
        }
    }

    func close() { channel.close(promise: nil) }
}

final class FTPDataHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    private var context: ChannelHandlerContext?
    private var sink: (any ResponseSink)?
    private var promise: EventLoopPromise<Int64>?
    private var limit: Int64 = .max
    private var received: Int64 = 0
    private var lastRead = NIODeadline.now()
    private var stall = TimeAmount.seconds(15)
    private var watchdog: Scheduled<Void>?
    private var pause: Scheduled<Void>?
    /// Bytes that arrived before the sink was given (the server may start at once).
    private var early: [ByteBuffer] = []
    private var ended = false

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func start(sink: any ResponseSink, limit: Int64?, stall: TimeAmount, promise: EventLoopPromise<Int64>) {
        self.sink = sink
        self.promise = promise
        self.limit = limit ?? .max
        self.stall = stall
        lastRead = .now()
        arm()
        for buffer in early { deliver(buffer) }
        early = []
        if ended { finish(nil) }
        context?.read()
    }

    private func arm() {
        guard let context else { return }
        watchdog = context.eventLoop.assumeIsolated().scheduleTask(deadline: lastRead + stall) { [weak self] in
            guard let self, self.promise != nil else { return }
            if self.pause != nil || NIODeadline.now() < self.lastRead + self.stall { return self.arm() }
            self.finish(TransportError.stalled(seconds: Double(self.stall.nanoseconds) / 1e9))
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        if sink == nil { early.append(buffer); return }
        deliver(buffer)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if promise != nil, pause == nil { context.read() }
    }

    private func deliver(_ buffer: ByteBuffer) {
        guard let sink, promise != nil else { return }
        lastRead = .now()
        let take = Int(min(Int64(buffer.readableBytes), limit - received))
        do {
            let seconds = try buffer.withUnsafeReadableBytes { try sink.receiveBody(UnsafeRawBufferPointer(rebasing: $0[0..<take])) }
            received += Int64(take)
            if received >= limit { return finish(nil) }
            if seconds > 0, pause == nil, let context {
                pause = context.eventLoop.assumeIsolated().scheduleTask(in: Seconds.timeAmount(min(seconds, 86400))) { [weak self] in
                    self?.pause = nil
                    self?.lastRead = .now()
                    self?.context?.read()
                }
            }
        } catch {
            finish(error)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        ended = true
        if promise != nil { finish(nil) }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if promise != nil { finish(HTTPClientTransport.classify(error)) }
        context.close(promise: nil)
    }

    /// Ends the stream: with the bytes received, or `error`.
    func finish(_ error: (any Error)?) {
        guard let promise else { return }
        self.promise = nil
        watchdog?.cancel()
        pause?.cancel()
        pause = nil
        sink = nil
        if let error { promise.fail(error) } else { promise.succeed(received) }
        context?.close(promise: nil)
    }
}

/// Completes a promise when the TLS handshake under it is done (or fails with its error).
final class TLSReady: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    let done: EventLoopPromise<Void>
    init(_ done: EventLoopPromise<Void>) { self.done = done }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .handshakeCompleted? = event as? TLSUserEvent { done.succeed(()) }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        done.fail(error)
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        done.fail(TransportError.transient("the FTP server closed the connection during the TLS handshake"))
        context.fireChannelInactive()
    }
}
