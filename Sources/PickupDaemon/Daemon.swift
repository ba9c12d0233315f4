import Atomics
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import HummingbirdWebSocket
import NIOCore
import Logging
import NIOConcurrencyHelpers
import Pickup
import ServiceLifecycle
import SystemPackage

/// How a ``Daemon`` runs.
public struct DaemonConfiguration: Sendable {
    /// Every file goes inside this directory (the download root).
    public var root: FilePath
    /// The manager's database, the token, the address file and the settings.
    public var stateDirectory: FilePath
    /// Address to listen on (default loopback).
    public var host = "127.0.0.1"
    /// Port (0: any free port; the address file says which).
    public var port = Daemon.defaultPort
    /// Downloads at once, replacing the saved setting when given.
    public var maxConcurrentDownloads: Int?
    /// The global speed limit from the command line (over the saved setting), bytes per second.
    public var speedLimit: Int64?
    /// The queue's order from the command line (over the saved setting).
    public var order: QueueOrder?
    /// Commands run when a download ends (from the command line or the settings file, never from
    /// the API): see ``Hooks``.
    public var hooks = Hooks()
    /// Engine settings (connections, retries, checkpoint interval...).
    public var engine = DownloadOptions()
    /// HTTP client settings (timeouts, TLS).
    public var transport = HTTPClientTransport.Options()
    /// How often progress goes to the event stream, seconds.
    public var progressInterval = 0.5
    /// Event-stream clients at once (one more gets 503).
    public var maxEventClients = 128
    /// Bytes of changes queued for one event-stream client before it is cut off (it reconnects
    /// for a new snapshot).
    public var maxEventBacklog = 1 << 20
    /// Seconds a connection may go without a complete request head (idle between requests, or
    /// sending its head slowly) before it is closed: what a client holding connections can delay
    /// others by. Not while a response is being written (an event stream stays open).
    public var idleTimeout = 30.0
    /// Connections at once; one more is closed as soon as it is accepted.
    public var maxConnections = 256
    /// aria2's JSON-RPC at `/jsonrpc` (HTTP and WebSocket), the token as its secret: off unless asked.
    public var aria2RPC = false
    /// Browser origins that may call `/jsonrpc` (`*`: every one); the REST API's rule is not changed.
    public var rpcAllowOrigins: [String] = []
    /// WebSocket clients of `/jsonrpc` at once.
    public var maxWebSocketClients = 64

    /// A configuration.
    public init(root: FilePath, stateDirectory: FilePath) {
        self.root = root
        self.stateDirectory = stateDirectory
    }
}

/// `pickup serve`: a ``DownloadManager`` in a long-lived process, driven over HTTP (`/api/v1`,
/// bearer token), with a web page at `/`. SIGTERM and SIGINT checkpoint every download and end
/// the process cleanly; the next start resumes them.
public final class Daemon: Sendable {
    /// The port `pickup serve` listens on unless told otherwise.
    public static let defaultPort = 6880

    /// The downloads.
    public let manager: DownloadManager
    /// The bearer token every API call must carry.
    public let token: String
    /// Whether the token was made by this start (print it once).
    public let tokenIsNew: Bool
    /// The download root, symlinks resolved.
    public let root: FilePath
    let configuration: DaemonConfiguration
    let files: DaemonFiles
    /// The settings the API changes (`/settings`, `settings.json`).
    let settings: DaemonSettings
    /// What `Host` may say once listening: the daemon's own addresses with the bound port.
    let authorities = NIOLockedValueBox<Set<String>>([])
    /// The running service group, to stop it as a signal would.
    let group = NIOLockedValueBox<ServiceGroup?>(nil)
    /// The event streams' fan-out.
    let hub: EventHub
    /// Connections open now (``ConnectionLimit``).
    let connections = ManagedAtomic(0)
    /// The hooks: the command line's, else the settings file's.
    public let hooks: Hooks
    /// aria2's JSON-RPC, when asked for (``DaemonConfiguration/aria2RPC``).
    let aria2: Aria2Service?

    /// Opens the state directory (refusing one another process drives), the token (made on first
    /// start, mode 0600) and the saved settings.
    /// - Throws: ``PickupError``, with a one-line reason.
    public init(configuration: DaemonConfiguration) throws(PickupError) {
        var configuration = configuration
        let files = DaemonFiles(directory: configuration.stateDirectory)
        do {
            try FileManager.default.createDirectory(atPath: configuration.root.string, withIntermediateDirectories: true)
        } catch {
            throw .fileSystem("cannot create \(configuration.root): \(error.localizedDescription)", .ioError)
        }
        do {
            // The owner's alone (0700): it holds the token and settings that may hold a password.
            try StateDirectory.prepare(configuration.stateDirectory)
        } catch {
            throw .fileSystem("cannot create \(configuration.stateDirectory): \(error.description)", .ioError)
        }
        let root = Confinement.realPath(configuration.root)
        configuration.root = root
        // API clients name files inside the root: a state directory they could name would let one
        // of them write the daemon's own files (settings.json with a hook, the token). Refused at
        // start, unless a hidden component stands between (`~/.local/state/...` under a root of
        // `~`), which no name an API client gives may contain (`Confinement`).
        let state = Confinement.realPath(configuration.stateDirectory)
        if state.starts(with: root) {
            let between = state.components.dropFirst(root.components.count)
            if !between.contains(where: { $0.string.hasPrefix(".") }) {
                throw .invalidInput("the state directory \(state) is inside the download root \(root), where API clients "
                    + "write; use --state or PICKUP_STATE_DIR elsewhere (or below a hidden directory)")
            }
        }
        let saved = files.loadSettings()
        var manager = DownloadManager.Configuration(stateDirectory: configuration.stateDirectory.appending("manager"))
        manager.maxConcurrentDownloads = max(1, configuration.maxConcurrentDownloads ?? saved?.maxConcurrentDownloads ?? 3)
        manager.speedLimit = configuration.speedLimit ?? saved?.speedLimit ?? nil
        manager.order = configuration.order ?? saved.flatMap { QueueOrder(rawValue: $0.order) } ?? .fifo
        manager.startsAllAtOnce = saved?.startsAllAtOnce ?? false
        manager.progressInterval = configuration.progressInterval
        manager.engine = configuration.engine
        manager.transport = configuration.transport
        if let tunnel = saved?.proxyTunnel { manager.transport.proxies.tunnel = tunnel }
        if let saved = saved?.proxy, let rules = try? Self.proxyRules(saved, over: manager.transport.proxies) {
            // Set through the API: not for downloads that carry secrets.
            manager.untrustedProxies = rules
        }
        manager.root = root
        // Whole paths (the daemon's directories do not move; single downloads key the index so too).
        manager.pathBases = .none
        self.manager = try DownloadManager(configuration: manager)
        // As the manager holds them (a limit below the minimum raised to it).
        let initial = APISettings(maxConcurrentDownloads: manager.maxConcurrentDownloads,
                                  speedLimit: RateLimiter(bytesPerSecond: manager.speedLimit).bytesPerSecond,
                                  proxy: saved?.proxy, proxyTunnel: saved?.proxyTunnel, order: manager.order.rawValue,
                                  startsAllAtOnce: manager.startsAllAtOnce)
        settings = DaemonSettings(initial, manager: self.manager, files: files, started: configuration.transport.proxies)
        (token, tokenIsNew) = try files.token()
        self.root = root
        hub = EventHub(maxClients: configuration.maxEventClients, maxBuffered: configuration.maxEventBacklog)
        let fileHooks = files.loadHooks { FileHandle.standardError.write(Data("pickup serve: \($0)\n".utf8)) }
        hooks = Hooks(onComplete: configuration.hooks.onComplete ?? fileHooks.onComplete,
                      onError: configuration.hooks.onError ?? fileHooks.onError,
                      timeout: configuration.hooks.onComplete != nil || configuration.hooks.onError != nil
                          ? configuration.hooks.timeout : fileHooks.timeout)
        aria2 = configuration.aria2RPC
            ? Aria2Service(manager: self.manager, settings: settings, root: root, token: token,
                           origins: try Aria2Origins(configuration.rpcAllowOrigins), authorities: authorities,
                           connections: configuration.engine.connections, maxWebSockets: configuration.maxWebSocketClients)
            : nil
        self.configuration = configuration
        self.files = files
    }

    /// Serves until SIGTERM or SIGINT (when `handlesSignals`) or until the calling task is
    /// cancelled; then checkpoints every download, shuts the manager down and removes the address
    /// file. `onListening` gets the base URL once the port is bound (the address file has it too).
    public func run(handlesSignals: Bool = true, onListening: @escaping @Sendable (String) async -> Void = { _ in }) async throws {
        await hub.start(manager, root: root)
        var logger = Logger(label: "pickup.serve")
        logger.logLevel = .error
        let router = Router(context: BasicRequestContext.self)
        Routes(daemon: self).register(on: router)
        let host = configuration.host
        let open = connections
        // Never so many connections that accepting one fails for want of a descriptor (EMFILE):
        // the server would retry the accept in a loop, and the downloads, hooks and files need
        // descriptors too. Half of what the process may open, after raising its soft limit.
        let limit = min(configuration.maxConnections, Self.connectionBudget())
        let idle = Seconds.timeAmount(configuration.idleTimeout)
        var server = HTTPServerBuilder.http1(configuration: .init(additionalChannelHandlers: [ConnectionLimit(open: open, limit: limit)],
                                                                 idleTimeout: idle))
        if let aria2 {
            aria2.register(on: router)
            await aria2.notifier.start(manager)
            // The same server, with WebSocket upgrades to /jsonrpc.
            let webSocket = aria2.webSocketRouter().buildResponder()
            server = HTTPServerBuilder { responder in
                GuardedChildChannel(
                    inner: HTTP1WebSocketUpgradeChannel(
                        responder: responder, webSocketResponder: webSocket,
                        configuration: .init(http1: .init(additionalChannelHandlers: [], idleTimeout: idle),
                                             ws: .init(maxFrameSize: 1 << 20))),
                    open: open, limit: limit, firstHead: idle)
            }
        }
        let app = Application(
            router: router,
            server: server,
            configuration: .init(address: .hostname(host, port: configuration.port), serverName: nil),
            onServerRunning: { [self] channel in
                let port = channel.localAddress?.port ?? configuration.port
                let allowed = allowedAuthorities(port: port)
                authorities.withLockedValue { $0 = allowed }
                let url = "http://\(Self.urlHost(host)):\(port)"
                files.writeAddress(url)
                await onListening(url)
            },
            logger: logger)
        let group = ServiceGroup(configuration: .init(
            services: [app, ManagerService(daemon: self)],
            gracefulShutdownSignals: handlesSignals ? [.sigterm, .sigint] : [],
            logger: logger))
        self.group.withLockedValue { $0 = group }
        let hooked = hooks.isEmpty ? nil : Task { await self.runHooks() }
        do {
            try await group.run()
        } catch {
            await Self.end(hooked)
            throw error
        }
        await Self.end(hooked)
    }

    /// Stops the hooks' runner and waits for it: a running hook's process group gets SIGTERM at
    /// once and SIGKILL after the grace, so `serve` never exits leaving one behind. Bounded by
    /// the runner's own bounds (``HookRunner/grace`` plus ``HookRunner/reapBound``).
    static func end(_ hooked: Task<Void, Never>?) async {
        hooked?.cancel()
        await hooked?.value
    }

    /// Runs the hooks as downloads complete or fail, until the manager shuts down.
    func runHooks() async {
        let runner = HookRunner(hooks: hooks) { line in FileHandle.standardError.write(Data("pickup serve: \(line)\n".utf8)) }
        var states: [DownloadID: DownloadState] = [:]
        for await event in await manager.events() {
            switch event {
            case .snapshot(let all, _):
                for info in all { states[info.id] = info.state }
            case .added(let info), .changed(let info):
                let before = states.updateValue(info.state, forKey: info.id)
                guard info.state.isFinal, before != info.state else { continue }
                let completed = info.state == .completed
                runner.fire(HookEvent(path: info.path?.string, url: info.url,
                                      size: completed ? info.progress.totalBytes ?? info.progress.bytesDone : info.progress.totalBytes,
                                      completed: completed, error: info.failure?.reason))
            case .removed(let id):
                states[id] = nil
            default:
                break
            }
        }
        // The daemon is stopping: a hook still running is stopped with its process group.
        runner.stop()
        await runner.drain()
    }

    /// Stops a running daemon as SIGTERM does: every download checkpointed, the manager shut
    /// down, then the server closed; ``run(handlesSignals:onListening:)`` returns.
    public func stop() async {
        await group.withLockedValue { $0 }?.triggerGracefulShutdown()
    }

    /// The rules for the proxy setting `text`: every URL through it, but the hosts `serve` was told
    /// to reach directly (and tunnelled as `started` says).
    static func proxyRules(_ text: String, over started: ProxyRules) throws(PickupError) -> ProxyRules {
        let p = try ProxyURL(parsing: text)
        return ProxyRules(http: p, https: p, ftp: p, noProxy: started.noProxy, tunnel: started.tunnel)
    }

    /// Checks `--rpc-allow-origin`'s values (``DaemonConfiguration/rpcAllowOrigins``).
    /// - Throws: ``PickupError/invalidInput(_:)`` naming the first that is not an origin or `*`.
    public static func checkRPCOrigins(_ values: [String]) throws(PickupError) {
        _ = try Aria2Origins(values)
    }

    /// Connections the process can afford: half of its descriptor limit (the soft limit raised to
    /// the hard one, at most 65,536), at least 16.
    static func connectionBudget() -> Int {
        var limits = rlimit()
        #if canImport(Glibc)
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        #else
        let resource = RLIMIT_NOFILE
        #endif
        guard getrlimit(resource, &limits) == 0 else { return 256 }
        let wanted = min(limits.rlim_max, 65_536)
        if limits.rlim_cur < wanted {
            var raised = limits
            raised.rlim_cur = wanted
            if setrlimit(resource, &raised) == 0 { limits = raised }
        }
        return max(16, Int(min(limits.rlim_cur, 1 << 20)) / 2)
    }

    /// Host names a request may carry in `Host` (and `Origin`): the daemon's own address only.
    func allowedAuthorities(port: Int) -> Set<String> {
        var hosts: Set<String> = ["127.0.0.1", "localhost", "[::1]", Self.urlHost(configuration.host)]
        if configuration.host == "0.0.0.0" || configuration.host == "::" {
            // Listening everywhere: the machine's own name is its address too.
            hosts.insert(ProcessInfo.processInfo.hostName)
        }
        return Set(hosts.map { "\($0):\(port)".lowercased() })
    }

    static func urlHost(_ host: String) -> String {
        host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
    }

    /// Whether `host` is a loopback address.
    public static func isLoopback(_ host: String) -> Bool {
        host == "localhost" || host == "::1" || host == "[::1]" || host.hasPrefix("127.")
    }

    /// Why ``run(handlesSignals:onListening:)`` failed, in words, for a daemon to listen on
    /// `address`: a port in use, a privileged port, an address not this machine's.
    public static func failure(_ error: any Error, listening address: String) -> String {
        guard let code = (error as? IOError)?.errnoCode else { return "cannot serve on \(address): \(error)" }
        let why = switch code {
        case EADDRINUSE: "the address is already in use (another pickup serve?)"
        case EACCES: "permission denied (a port below 1024 needs privileges)"
        case EADDRNOTAVAIL: "the address is not one of this machine's"
        default: String(cString: strerror(code))
        }
        return "cannot listen on \(address): \(why)"
    }
}

/// Shuts the manager down first when the process is asked to stop (services stop in reverse
/// order), so event streams end and every download is checkpointed before the server closes.
struct ManagerService: Service {
    let daemon: Daemon

    func run() async throws {
        try? await gracefulShutdown()
        await daemon.manager.shutdown()
        daemon.files.removeAddress()
    }
}
