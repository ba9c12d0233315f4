import Foundation
import AsyncHTTPClient
import Atomics
import HTTPTypes
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import SystemPackage
#if canImport(Network) && canImport(NIOTransportServices)
import Network
import NIOTransportServices
#endif

/// The ``Transport`` on AsyncHTTPClient.
///
/// Configured for downloads: no decompression (it would break byte offsets), no automatic
/// redirects (the engine follows them and refuses https-to-http downgrades), HTTP/1.1 only (so
/// that several connections per file are several TCP connections), a read timeout that acts as
/// stall detection, and TLS verified unless ``Options/insecure`` is set.
public final class HTTPClientTransport: Transport {
    /// Transport settings.
    public struct Options: Sendable {
        /// Seconds to wait for a connection.
        public var connectTimeout: Double = 15
        /// Seconds without a byte before a connection counts as stalled and is dropped.
        public var stallTimeout: Double = 15
        /// The longest stall timeout: a request after a stall before the body, or on a connection
        /// that has stalled before, waits twice as long as the one before, up to this.
        public var maxStallTimeout: Double = 120
        /// Seconds from sending a request to having its whole response head: a server that sends
        /// a head byte by byte (each resetting the stall timer) fails as a protocol error.
        public var headTimeout: Double = 30
        /// Skip TLS certificate verification.
        public var insecure: Bool = false
        /// PEM files of certificates trusted in addition to the system's roots (`--ca-certificate`,
        /// `SSL_CERT_FILE`, the files of `SSL_CERT_DIR`).
        public var extraTrustRoots: [String] = []
        /// `User-Agent` sent with every request.
        public var userAgent: String = "pickup/\(PickupVersion.string)"
        /// Connections kept per host.
        public var maxConnectionsPerHost: Int = 32
        /// Largest read from a socket, in bytes. Large reads mean fewer trips through the kernel
        /// and the HTTP stack per GiB (on loopback, 1 MiB reads cost a fifth less CPU than 256 KiB).
        public var maxReadSize = 1 << 20
        /// Read buffers of all connections together stay near this many bytes: each connection
        /// reads at most `readBudget / shares in flight` (never below 64 KiB), so one plain http
        /// connection reads 1 MiB while 16 read 64 KiB each and memory stays bounded. A request
        /// whose URL is https or ftps takes two shares (``ReadBudget/weight(of:)``; one such
        /// connection reads 512 KiB): TLS holds each read twice, as the ciphertext read and the
        /// plaintext it decrypts to. (By the URL's scheme: through an http proxy's CONNECT tunnel
        /// the connection is TLS too, and is counted so.)
        public var readBudget = 1 << 20
        /// Which requests go through which proxy (none by default; the CLI reads `--proxy` and the
        /// environment). Several connections per file work through a proxy too.
        public var proxies = ProxyRules()
        /// Called with each request's head and each response's head as text (`-v`), numbered by
        /// request, secrets redacted (see ``Trace``); nil: nothing is shown, and nothing costs.
        public var trace: (@Sendable (String) -> Void)?
        /// On Apple platforms, direct requests go over Network.framework (NIOTransportServices):
        /// the system picks the path (Wi-Fi or cellular, waking the radio; VPN on demand) and
        /// verifies TLS. Requests through a configured proxy, and every request when
        /// ``extraTrustRoots`` is not empty (Network.framework can only replace the system's roots,
        /// not add to them), go over NIO's sockets and NIOSSL, as everywhere else. Ignored on
        /// other platforms. See ``HTTPClientTransport/stack(networkFramework:available:proxy:extraTrustRoots:)``.
        public var networkFramework = true

        /// Default options.
        public init() {}
    }

    /// AsyncHTTPClient's clients by proxy (nil: direct), patience and HTTP version: created when
    /// first needed (a stall timeout is a client's setting, a request that waits longer takes
    /// another client; and the HTTP version is a client's setting, so requests that may share an
    /// HTTP/2 connection (``FetchRequest/multiplex``) have clients of their own).
    let clients: NIOLockedValueBox<[ClientKey: HTTPClient]>
    /// Which network stack a client runs on.
    enum Stack: Hashable, Sendable {
        /// NIO's POSIX event loops and sockets, TLS by NIOSSL: everywhere.
        case posix
        /// Network.framework (NIOTransportServices' event loops), TLS by the system: Apple platforms.
        case network
    }

    /// The stack of a request's client: Network.framework only where it is `available`, asked for
    /// (`networkFramework`), going direct (no proxy of ours: one configured is never bypassed, and
    /// NIO's SOCKS handler, not the system, speaks to it), and with no trust roots added to the
    /// system's (Network.framework's TLS options take roots that replace the system's).
    static func stack(networkFramework: Bool, available: Bool, proxy: ProxyURL?, extraTrustRoots: Bool) -> Stack {
        available && networkFramework && proxy == nil && !extraTrustRoots ? .network : .posix
    }

    /// Whether Network.framework can be used here (Apple platforms).
    static var networkFrameworkAvailable: Bool {
        #if canImport(Network) && canImport(NIOTransportServices)
        // (NIOTransportServices' floor; the package's own is above it except on watchOS and tvOS.)
        if #available(macOS 10.14, iOS 12, tvOS 12, watchOS 6, *) { return true }
        #endif
        return false
    }

    /// The event loops of a stack.
    static func group(_ stack: Stack) -> any EventLoopGroup {
        #if canImport(Network) && canImport(NIOTransportServices)
        if stack == .network, #available(macOS 10.14, iOS 12, tvOS 12, watchOS 6, *) { return NIOTSEventLoopGroup.singleton }
        #endif
        return MultiThreadedEventLoopGroup.singleton
    }

    struct ClientKey: Hashable {
        let proxy: ProxyURL?
        let patience: Int
        var multiplex = false
    }
    let configuration: HTTPClient.Configuration
    /// The stack of direct requests (a SOCKS proxy's go over ``Stack/posix``).
    let directStack: Stack
    /// The event loops of direct requests' clients, which ``FetchRequest/lane`` picks from (the
    /// POSIX ones, ``loops``, unless they run on Network.framework).
    let directLoops: [any EventLoop]
    /// Requests through HTTP proxies (absolute form, or CONNECT tunnels).
    let viaProxy: ProxyTransport
    /// `ftp://` requests.
    let ftp: FTPTransport
    let proxies: ProxyRules
    /// NIO's POSIX event loops: proxies, FTP, TLS diagnostics, and every client on ``Stack/posix``.
    let loops: [any EventLoop]
    let budget: ReadBudget
    let defaultHeaders: HTTPHeaders
    let headTimeout: TimeAmount
    let stallTimeout: Double
    let maxStallTimeout: Double
    let isShutDown = ManagedAtomic(false)
    let trace: (@Sendable (String) -> Void)?
    /// Requests traced so far (their numbers).
    let traced = ManagedAtomic(0)

    /// How long closing a TLS connection waits for the peer's close_notify (ours is sent first).
    static let tlsShutdownTimeout = TimeAmount.milliseconds(20)

    /// Creates a transport with its own HTTP client.
    public init(options: Options = Options()) {
        var tls = TLSConfiguration.makeClientConfiguration()
        if options.insecure { tls.certificateVerification = .none }
        let extra = Self.trustRoots(options.extraTrustRoots)
        if !extra.isEmpty { tls.additionalTrustRoots = [.certificates(extra)] }
        // Closing sends our close_notify and waits for the peer's at most this long (RFC 8446 §6.1:
        // the side that closes need not wait for it). A connection cut while the server still
        // sends never gets one, and swift-nio-ssl's default wait (5 s) held every exit that long.
        tls.shutdownTimeout = Self.tlsShutdownTimeout
        var pool = HTTPClient.Configuration.ConnectionPool()
        pool.concurrentHTTP1ConnectionsPerHostSoftLimit = options.maxConnectionsPerHost
        // A refused connection should reach the engine at once, which retries with its own backoff.
        pool.retryConnectionEstablishment = false
        var config = HTTPClient.Configuration(
            tlsConfiguration: tls,
            redirectConfiguration: .disallow,
            timeout: .init(
                connect: Seconds.timeAmount(options.connectTimeout),
                read: Seconds.timeAmount(options.stallTimeout)),
            connectionPool: pool,
            proxy: nil,
            decompression: .disabled)
        config.httpVersion = HTTPClient.Configuration.HTTPVersion.http1Only
        let budget = ReadBudget(maxRead: options.maxReadSize, budget: options.readBudget)
        self.budget = budget
        config.http1_1ConnectionDebugInitializer = { channel in
            channel.setOption(ChannelOptions.recvAllocator, value: BudgetedRecvAllocator(budget: budget)).flatMap {
                channel.setOption(ChannelOptions.maxMessagesPerRead, value: ReadBudget.readsPerWakeUp)
            }
        }
        // (An HTTP/2 connection reads for all its streams: the same budget.)
        config.http2ConnectionDebugInitializer = config.http1_1ConnectionDebugInitializer
        configuration = config
        directStack = Self.stack(networkFramework: options.networkFramework, available: Self.networkFrameworkAvailable,
                                 proxy: nil, extraTrustRoots: !extra.isEmpty)
        stallTimeout = options.stallTimeout
        maxStallTimeout = max(options.stallTimeout, options.maxStallTimeout)
        // Direct requests on Network.framework where it is chosen (``stack(networkFramework:available:proxy:extraTrustRoots:)``),
        // the rest on NIO's POSIX event loops, where AsyncHTTPClient takes its ClientBootstrap +
        // NIOSSL path. See ARCHITECTURE.md, "Platforms".
        let direct = HTTPClient(eventLoopGroup: Self.group(directStack), configuration: Self.adapted(config, to: directStack, budget: budget))
        clients = NIOLockedValueBox([ClientKey(proxy: nil, patience: 0): direct])
        proxies = options.proxies
        loops = Array(MultiThreadedEventLoopGroup.singleton.makeIterator())
        directLoops = directStack == .posix ? loops : Array(direct.eventLoopGroup.makeIterator())
        headTimeout = Seconds.timeAmount(options.headTimeout)
        trace = options.trace
        defaultHeaders = ["User-Agent": options.userAgent, "Accept-Encoding": "identity", "Accept": "*/*"]
        viaProxy = ProxyTransport(loops: loops, tls: tls, connectTimeout: options.connectTimeout, headTimeout: headTimeout,
                                  budget: budget, userAgent: options.userAgent)
        ftp = FTPTransport(loops: loops, connectTimeout: options.connectTimeout, replyTimeout: headTimeout, budget: budget, tls: tls,
                           userAgent: options.userAgent)
    }

    public func stallTimeout(patience: Int) -> Double? {
        min(maxStallTimeout, stallTimeout * Double(1 << min(max(0, patience), 20)))
    }

    /// The client for requests through `proxy` (a SOCKS proxy, or nil) with this much patience;
    /// `multiplex`: one that speaks HTTP/2 when the server offers it.
    func client(via proxy: ProxyURL?, patience: Int, multiplex: Bool = false) -> HTTPClient {
        let key = ClientKey(proxy: proxy, patience: patience, multiplex: multiplex)
        return clients.withLockedValue { all in
            if let c = all[key] { return c }
            var c = configuration
            c.timeout.read = Seconds.timeAmount(stallTimeout(patience: patience) ?? stallTimeout)
            if let proxy { c.proxy = .socksServer(host: proxy.host, port: proxy.port) }
            if multiplex { c.httpVersion = .automatic }
            let stack = proxy == nil ? directStack : .posix
            let client = HTTPClient(eventLoopGroup: Self.group(stack), configuration: Self.adapted(c, to: stack, budget: budget))
            all[key] = client
            return client
        }
    }

    /// `configuration` for a client on `stack`. On Network.framework: a connection that cannot be
    /// made fails (Network.framework would otherwise wait for connectivity until the connect
    /// timeout, and the engine retries with its own backoff); NIO's read allocator and reads per
    /// wake-up are not options of its channels (setting them ends in `fatalError`), so each
    /// connection's reads are bounded by its largest receive instead, the read budget's share at
    /// the time it connects. Certificates are verified by the system (no roots of ours: there
    /// are none added on this stack).
    static func adapted(_ configuration: HTTPClient.Configuration, to stack: Stack, budget: ReadBudget) -> HTTPClient.Configuration {
        #if canImport(Network) && canImport(NIOTransportServices)
        guard stack == .network, #available(macOS 10.14, iOS 12, tvOS 12, watchOS 6, *) else { return configuration }
        var c = configuration
        c.networkFrameworkWaitForConnectivity = false
        // With roots set (NIOSSL's default is `.default`, not nil) AsyncHTTPClient installs a
        // verify block that prints "Trust failed" to standard output (the data of `-o -`) and
        // only passes or fails; without, the system verifies as for any app.
        if c.tlsConfiguration?.certificateVerification == .fullVerification { c.tlsConfiguration?.trustRoots = nil }
        c.http1_1ConnectionDebugInitializer = { channel in
            channel.setOption(NIOTSChannelOptions.maximumReceiveLength, value: budget.limit)
        }
        c.http2ConnectionDebugInitializer = c.http1_1ConnectionDebugInitializer
        return c
        #else
        return configuration
        #endif
    }

    /// The certificates of these PEM files, read and parsed once, each once. Given as files,
    /// NIOSSL reads and parses them again for every TLS context it makes, and AsyncHTTPClient makes
    /// one per connection that finds none cached: with `SSL_CERT_DIR` naming a system's 140 files,
    /// a batch's 16 first connections read 2,300 files, most of an https batch's CPU (0.77 s of
    /// it for 400 small files, 0.40 s without them) and 25 MiB.
    static func trustRoots(_ paths: [String]) -> [NIOSSLCertificate] {
        var seen = Set<NIOSSLCertificate>(), all: [NIOSSLCertificate] = []
        for path in paths {
            for certificate in (try? NIOSSLCertificate.fromPEMFile(path)) ?? [] where seen.insert(certificate).inserted {
                all.append(certificate)
            }
        }
        return all
    }

    /// Checks that a file holds PEM certificates.
    /// - Throws: ``PickupError/invalidInput(_:)``.
    public static func checkCertificates(_ path: String) throws(PickupError) {
        guard let certificates = try? NIOSSLCertificate.fromPEMFile(path), !certificates.isEmpty else {
            throw .invalidInput("\(path) holds no PEM certificate")
        }
    }

    /// The PEM files that `SSL_CERT_FILE` and `SSL_CERT_DIR` name, less those the platform's own
    /// trust already holds. On Linux NIOSSL trusts the distribution's bundle and certificate
    /// directory (`/etc/ssl/certs/ca-certificates.crt` or `/etc/pki/tls/certs/ca-bundle.crt`, and
    /// `/etc/ssl/certs`, looked up by hashed name as OpenSSL's tools do); many containers point both
    /// variables at exactly those, and reading them again parsed some 150 certificates at every start
    /// and added each again to every TLS context's store. Compared by their real paths.
    public static func environmentTrustRoots(_ environment: [String: String]) -> [String] {
        let file = environment["SSL_CERT_FILE"].flatMap { isPlatformTrust($0, candidates: platformBundles) ? nil : $0 }
        let directory = environment["SSL_CERT_DIR"].flatMap { isPlatformTrust($0, candidates: platformDirectories) ? nil : $0 }
        return [file].compactMap { $0 }.filter(looksLikePEM) + (directory.map(certificateFiles(in:)) ?? [])
    }

    #if os(Linux)
    /// NIOSSL's search lists (its `LinuxCABundle.swift`): the first that exists is the one trusted.
    static let platformBundles = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"]
    static let platformDirectories = ["/etc/ssl/certs"]
    #else
    // Apple platforms trust through the system's keychain: every file named is an addition.
    static let platformBundles: [String] = []
    static let platformDirectories: [String] = []
    #endif

    /// Whether `path` is, by its real path, the first of `candidates` that exists.
    static func isPlatformTrust(_ path: String, candidates: [String]) -> Bool {
        guard let trusted = candidates.first(where: { FileManager.default.fileExists(atPath: $0) }) else { return false }
        func real(_ p: String) -> String? {
            guard let resolved = realpath(p, nil) else { return nil }
            defer { free(resolved) }
            return String(cString: resolved)
        }
        guard let mine = real(path), let theirs = real(trusted) else { return false }
        return mine == theirs
    }

    /// The PEM files a directory of certificates holds (`SSL_CERT_DIR`): `*.pem` and `*.crt`.
    public static func certificateFiles(in directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted()
            .filter { $0.hasSuffix(".pem") || $0.hasSuffix(".crt") }
            .map { directory + "/" + $0 }
            .filter(looksLikePEM)
    }

    /// Whether a file's first 64 KiB hold a PEM certificate's first line: a cheap look, made at
    /// every start for the environment's files (parsing a system's whole bundle costs a start-up
    /// 10 ms); NIOSSL reads them when a TLS connection needs them.
    public static func looksLikePEM(_ path: String) -> Bool {
        guard let bytes = FS.readPrefix(FilePath(path), count: 64 << 10) else { return false }
        let marker = Array("-----BEGIN CERTIFICATE-----".utf8)
        guard bytes.count >= marker.count else { return false }
        return (0...(bytes.count - marker.count)).contains { i in bytes[i] == marker[0] && bytes[i..<(i + marker.count)].elementsEqual(marker) }
    }

    /// How an `ftp://` or `ftps://` request goes: FTP directly, FTP through a SOCKS5 proxy or
    /// `CONNECT` tunnels (``FTPTransport``), or, nil, to an HTTP proxy in absolute form
    /// (``ProxyTransport``). Never direct while a proxy applies: an `ftps://` URL that an HTTP
    /// proxy cannot carry (no `--proxytunnel`: a proxy's FTP gateway speaks plain FTP) is refused.
    static func ftpRoute(_ url: String, secure: Bool, proxies: ProxyRules) throws(TransportError) -> FTPTransport.Route? {
        guard let proxy = proxies.proxy(for: url) else { return .direct }
        switch proxy.kind {
        case .socks5: return .socks(proxy)
        case .http:
            if proxies.tunnel { return .tunnel(proxy) }
            if secure {
                throw .refused("an ftps:// URL cannot go through the HTTP proxy \(proxy) without --proxytunnel (its FTP gateway "
                    + "speaks plain FTP): add --proxytunnel to reach the server through CONNECT tunnels, or exclude the host with --noproxy")
            }
            return nil
        }
    }

    public func fetch<Sink: ResponseSink>(_ request: FetchRequest, into sink: Sink) async throws {
        guard let trace else { return try await send(request, into: sink) }
        let n = traced.wrappingIncrementThenLoad(ordering: .relaxed)
        let ftp = request.url.lowercased().hasPrefix("ftp")
        trace(Trace.request(n, url: request.url, fields: ftp ? request.headers.map { ($0.name.rawName, $0.value) } : headers(for: request).map { ($0.name, $0.value) }))
        try await send(request, into: TracingSink(sink, number: n, trace: trace))
    }

    /// The header fields of `request`: ours, with the user's User-Agent or Accept replacing ours and
    /// any other field added as given.
    func headers(for request: FetchRequest) -> HTTPHeaders {
        var headers = defaultHeaders
        for field in request.headers {
            let name = field.name.rawName
            if defaultHeaders.contains(name: name) { headers.replaceOrAdd(name: name, value: field.value) } else { headers.add(name: name, value: field.value) }
        }
        return headers
    }

    func send<Sink: ResponseSink>(_ request: FetchRequest, into sink: Sink) async throws {
        if let scheme = request.url.split(separator: ":", maxSplits: 1).first?.lowercased(), scheme == "ftp" || scheme == "ftps",
            let route = try Self.ftpRoute(request.url, secure: scheme == "ftps", proxies: proxies)
        {
            let stall = Seconds.timeAmount(stallTimeout(patience: request.patience) ?? stallTimeout)
            let weight = ReadBudget.weight(of: request.url)
            budget.inFlight.wrappingIncrement(by: weight, ordering: .relaxed)
            defer { budget.inFlight.wrappingDecrement(by: weight, ordering: .relaxed) }
            do {
                try await ftp.fetch(request, route: route, into: sink, stall: stall)
            } catch {
                try Task.checkCancellation()
                throw Self.classify(error)
            }
            return
        }
        let headers = headers(for: request)
        do {
            // Checked first: AsyncHTTPClient traps on some URLs it parses (a port out of range).
            try DownloadURL.check(request.url)
        } catch {
            throw TransportError.fatal("invalid URL \(DownloadURL.redacted(request.url)): \(error)")
        }
        let weight = ReadBudget.weight(of: request.url)
        budget.inFlight.wrappingIncrement(by: weight, ordering: .relaxed)
        defer { budget.inFlight.wrappingDecrement(by: weight, ordering: .relaxed) }
        // A lane keeps a request's delegate on one event loop, where AsyncHTTPClient then prefers
        // an idle connection (and opens new ones). Left to itself it runs each request's delegate
        // on the next loop in turn while reusing an idle connection from any loop, and hands every
        // chunk from one loop to the other. (`.delegateAndChannel` would be exact, but opens a
        // throwaway "overflow" connection whenever none is idle on that loop.)
        let proxy = proxies.proxy(for: request.url)
        let lanes = proxy == nil ? directLoops : loops
        let preference: HTTPClient.EventLoopPreference =
            request.lane.map { .delegate(on: lanes[$0 % lanes.count]) } ?? .indifferent
        let patience = max(0, request.patience)
        if let proxy, proxy.kind == .http {
            let stall = Seconds.timeAmount(stallTimeout(patience: patience) ?? stallTimeout)
            do {
                try await viaProxy.fetch(request, headers: headers, via: proxy, tunnelAlways: proxies.tunnel, stall: stall, into: sink)
            } catch {
                try Task.checkCancellation()
                throw Self.classify(error)
            }
            return
        }
        if request.url.lowercased().hasPrefix("ftp") {
            // An ftp:// URL reaches here only for an HTTP proxy in absolute form (above).
            throw TransportError.fatal("no route for \(DownloadURL.redacted(request.url))")
        }
        let req: HTTPClient.Request
        do {
            req = try HTTPClient.Request(url: request.url, method: .GET, headers: headers)
        } catch {
            throw TransportError.fatal("invalid URL \(DownloadURL.redacted(request.url)): \(error)")
        }
        let delegate = SinkDelegate(sink)
        let task = client(via: proxy, patience: patience, multiplex: request.multiplex)
            .execute(request: req, delegate: delegate, eventLoop: preference)
        delegate.armHeadDeadline(task, in: headTimeout)
        do {
            try await withTaskCancellationHandler {
                try await task.futureResult.get()
            } onCancel: {
                // A speed limit's pause holds the request until it ends: end it first.
                delegate.cancelPause(on: task.eventLoop)
                task.cancel()
            }
            await delegate.settled()  // (done already: AsyncHTTPClient ends a response after its head's future)
        } catch {
            await delegate.settled()
            try Task.checkCancellation()
            if delegate.headTimedOut.load(ordering: .relaxed) {
                throw TransportError.protocolViolation("no complete response head within \(headTimeout.nanoseconds / 1_000_000_000) s")
            }
            // (Its look at the certificates connects directly: never while a SOCKS proxy applies;
            // through NIOSSL on a POSIX loop, whatever the request's stack.)
            if proxy == nil, let tls = configuration.tlsConfiguration,
                let explained = await TLSFailure.explain(error, url: request.url, tls: tls, on: loops[0])
            { throw explained }
            throw Self.classify(error, stall: stallTimeout(patience: patience), url: request.url)
        }
    }

    public func shutdown() async {
        guard isShutDown.compareExchange(expected: false, desired: true, ordering: .relaxed).exchanged else { return }
        viaProxy.shutdown()
        for c in clients.withLockedValue({ Array($0.values) }) { try? await c.shutdown() }
    }

    deinit {
        // Dropped without shutdown(): release the connections in the background rather than leak them.
        if isShutDown.compareExchange(expected: false, desired: true, ordering: .relaxed).exchanged {
            viaProxy.shutdown()
            for c in clients.withLockedValue({ Array($0.values) }) { c.shutdown { _ in } }
        }
    }

    /// Maps errors of the HTTP stack to transient or fatal; errors the sink threw pass through.
    /// `url`, when known, names the host and port in the message.
    static func classify(_ error: any Error, stall: Double? = nil, proxy: ProxyURL? = nil, url: String? = nil) -> any Error {
        if error is any SinkError || error is TransportError || error is CancellationError || error is StaleConnection { return error }
        if let e = error as? HTTPClientError {
            if e == .cancelled { return CancellationError() }
            if e == .readTimeout { return stall.map { TransportError.stalled(seconds: $0) } ?? TransportError.transient("stalled") }
            if e == .connectTimeout { return TransportError.transient("connection timed out") }
            if e == .remoteConnectionClosed { return TransportError.transient("connection closed by the server") }
            if e == .invalidURL || e == .emptyHost || e == .emptyScheme {
                return TransportError.fatal("invalid URL: \(e)")
            }
            return TransportError.transient("\(e)")
        }
        if let e = error as? NIOConnectionError {
            if e.connectionErrors.isEmpty, e.dnsAError != nil || e.dnsAAAAError != nil {
                return TransportError.unresolved(host: e.host)
            }
            let what = (proxy == nil ? "" : "the proxy ") + Self.address(e.host, e.port)
            if let io = e.connectionErrors.first?.error as? IOError { return Self.connectionFailure(io.errnoCode, at: what) }
            return TransportError.transient("cannot connect to \(what)")
        }
        if let e = error as? ChannelError {
            switch e {
            case .connectTimeout: return TransportError.transient(proxy == nil ? "connection timed out" : "connection to the proxy timed out")
            default: return TransportError.transient("connection closed (\(e))")
            }
        }
        if let e = error as? SocketAddressError, case .unknown(let host, _) = e {
            return TransportError.unresolved(host: host)
        }
        if case NIOSSLError.uncleanShutdown = error {
            // AsyncHTTPClient's word for a TLS connection dropped mid-response: resumed as any other.
            return TransportError.transient("the connection was cut before the response ended (no TLS close_notify)")
        }
        if let e = error as? HTTPParserError {
            switch e {
            case .invalidEOFState, .closedConnection:
                return TransportError.transient("the response ended early (\(e))")
            case .headerOverflow:
                return TransportError.protocolViolation("the response head is larger than 80 KiB")
            default:
                return TransportError.protocolViolation("malformed response (\(e))")
            }
        }
        let origin = url.flatMap(Origin.init)
        #if canImport(Network) && canImport(NIOTransportServices)
        // Network.framework's errors, as AsyncHTTPClient passes them on.
        if let e = error as? HTTPClient.NWPOSIXError {
            guard let origin else { return TransportError.transient("\(e)") }
            return Self.connectionFailure(e.errorCode.rawValue, at: Self.address(origin.host, origin.port))
        }
        if #available(macOS 10.14, iOS 12, tvOS 12, watchOS 6, *), let e = error as? NWError {
            switch e {
            case .dns: return TransportError.unresolved(host: origin?.host ?? "the host")
            case .posix(let code):
                guard let origin else { return TransportError.transient("\(e)") }
                return Self.connectionFailure(code.rawValue, at: Self.address(origin.host, origin.port))
            default: break
            }
        }
        #endif
        if let e = error as? IOError {
            guard let origin else { return TransportError.transient(String(cString: strerror(e.errnoCode))) }
            return Self.connectionFailure(e.errnoCode, at: Self.address(origin.host, origin.port))
        }
        if let tls = TLSFailure(error) { return TransportError.fatal(tls.sentence(host: origin?.host, port: origin?.port)) }
        return TransportError.transient("\(error)")
    }

    /// `host:port`, an IPv6 address in brackets.
    static func address(_ host: String, _ port: Int) -> String {
        host.contains(":") && !host.hasPrefix("[") ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    /// A connection to `address` that failed with `errno`, in words that name it.
    static func connectionFailure(_ errno: Int32, at address: String) -> TransportError {
        switch errno {
        case ECONNREFUSED: .transient("connection refused by \(address)")
        case ECONNRESET: .transient("connection reset by \(address)")
        default: .transient("\(String(cString: strerror(errno))) (\(address))")
        }
    }
}

/// Adapts a ``ResponseSink`` to AsyncHTTPClient's delegate: the body callback writes through
/// and hands back a future that is already succeeded and reused, so the per-chunk path allocates
/// nothing of ours. Under a speed limit it hands back a timer's future instead: AsyncHTTPClient
/// reads nothing more from that connection until it fires.
final class SinkDelegate<Sink: ResponseSink>: HTTPClientResponseDelegate, @unchecked Sendable {
    typealias Response = Void
    // All calls arrive on the task's event loop, one after another (AsyncHTTPClient's contract),
    // so `done` needs no lock.
    let sink: Sink
    var done: EventLoopFuture<Void>?
    /// The speed limit's pause in progress, if any (touched on the task's event loop only).
    var pause: Scheduled<Void>?
    var cancelled = false
    /// The deadline for the response head (event loop only), and whether it passed.
    var headDeadline: Scheduled<Void>?
    var gotHead = false
    let headTimedOut = ManagedAtomic(false)

    init(_ sink: Sink) { self.sink = sink }

    /// The sink's work on the head, which may block (it runs on ``BlockingIO``): AsyncHTTPClient
    /// delivers no body part before it ends, and ``settled()`` waits for it after a failure.
    let headWork = NIOLockedValueBox<EventLoopFuture<Void>?>(nil)

    func didReceiveHead(task: HTTPClient.Task<Void>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
        done = task.eventLoop.makeSucceededVoidFuture()
        gotHead = true
        headDeadline?.cancel()
        headDeadline = nil
        let head = ResponseHead(status: Int(head.status.code), headers: head.headers.map { ($0.name, $0.value) })
        let sink = self.sink
        let work = BlockingIO.head(on: task.eventLoop) { try sink.receiveHead(head) }
        headWork.withLockedValue { $0 = work }
        return work
    }

    /// Returns once the sink's work on the head (if it began) has ended: a request that failed
    /// meanwhile (cancelled, cut) does not return while the sink still decides on its head.
    func settled() async {
        _ = try? await headWork.withLockedValue { $0 }?.get()
    }

    func didReceiveBodyPart(task: HTTPClient.Task<Void>, _ buffer: ByteBuffer) -> EventLoopFuture<Void> {
        do {
            let pause = try buffer.withUnsafeReadableBytes { try sink.receiveBody($0) }
            if pause > 0 {
                // A speed limit: read nothing more until the bucket has refilled (or the request
                // is cancelled: see ``cancelPause(on:)``).
                if cancelled { return task.eventLoop.makeFailedFuture(CancellationError()) }
                let timer = task.eventLoop.scheduleTask(in: Seconds.timeAmount(min(pause, 86400))) {}
                self.pause = timer
                return timer.futureResult
            }
            return done!
        } catch {
            return task.eventLoop.makeFailedFuture(error)
        }
    }

    func didFinishRequest(task: HTTPClient.Task<Void>) throws {}

    /// Cancels the request unless its head has arrived within `timeout`. From any thread.
    func armHeadDeadline(_ task: HTTPClient.Task<Void>, in timeout: TimeAmount) {
        task.eventLoop.execute {
            guard !self.gotHead else { return }
            self.headDeadline = task.eventLoop.scheduleTask(in: timeout) {
                guard !self.gotHead else { return }
                self.headTimedOut.store(true, ordering: .relaxed)
                task.cancel()
            }
        }
    }

    /// Ends a pause in progress (its future fails) and any later one, so a cancelled request is
    /// not held by a speed limit. From any thread.
    func cancelPause(on loop: any EventLoop) {
        loop.execute {
            self.cancelled = true
            self.pause?.cancel()
            self.pause = nil
        }
    }
}

/// The read size every connection of one transport may use: the budget shared by the requests in
/// flight, between 64 KiB and the largest read.
final class ReadBudget: Sendable {
    let maxRead: Int
    let budget: Int
    /// The shares taken by the requests in flight (``weight(of:)`` each).
    let inFlight = ManagedAtomic(0)
    static let minRead = 65536
    /// Reads per wake-up of a connection (NIO's `maxMessagesPerRead`, 4 by default), which is also
    /// how many read buffers NIO keeps for the connection: a buffer still held downstream (by TLS
    /// for a record cut in two, or by the HTTP parser) makes NIO take another, and each keeps the
    /// size it had. One: a read is up to 1 MiB anyway, and a connection keeps one buffer, not four.
    static let readsPerWakeUp: UInt = 1

    init(maxRead: Int, budget: Int) {
        self.maxRead = max(Self.minRead, maxRead)
        self.budget = max(Self.minRead, budget)
    }

    /// How many shares of the budget a request to `url` takes: two over TLS (https, ftps), whose
    /// connection holds each read twice (the ciphertext read, and NIOSSL's plaintext buffer that
    /// grows to what one read decrypts to), else one. Over https with 8 connections, 64 KiB reads
    /// instead of 128 KiB: 4.7 MiB less at the peak for 1 GiB, CPU within 4%; plain http keeps
    /// its larger reads (halving them there cost 14% more CPU).
    static func weight(of url: String) -> Int {
        url.prefix(6).lowercased() == "https:" || url.prefix(5).lowercased() == "ftps:" ? 2 : 1
    }

    /// The largest read a connection may make now (one relaxed atomic load).
    @inline(__always)
    var limit: Int { min(maxRead, max(Self.minRead, budget / max(1, inFlight.load(ordering: .relaxed)))) }
}

/// Sizes each socket read: starts at 64 KiB, doubles while reads fill the buffer, halves when one
/// fills less than a quarter of it, and never exceeds the transport's ``ReadBudget``.
struct BudgetedRecvAllocator: RecvByteBufferAllocator {
    let budget: ReadBudget
    var size = ReadBudget.minRead

    init(budget: ReadBudget) { self.budget = budget }

    func nextBufferSize() -> Int? { min(size, budget.limit) }

    func buffer(allocator: ByteBufferAllocator) -> ByteBuffer {
        allocator.buffer(capacity: min(size, budget.limit))
    }

    mutating func record(actualReadBytes n: Int) -> Bool {
        let current = min(size, budget.limit)
        if n >= current {
            size = min(current * 2, budget.limit)
        } else if n < current / 4 {
            size = max(ReadBudget.minRead, current / 2)
        } else {
            size = current
        }
        return size > current
    }
}
