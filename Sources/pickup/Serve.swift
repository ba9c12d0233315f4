import ArgumentParser
import Foundation
import Pickup
import PickupDaemon
import SystemPackage

/// The daemon's state directory, shared by `serve` and the client commands.
struct DaemonState: ParsableArguments {
    @Option(help: ArgumentHelp(
        "The daemon's state directory (default: $PICKUP_STATE_DIR/daemon, else ~/.local/state/pickup/daemon).",
        valueName: "dir"))
    var state: String?

    var path: FilePath { state.map { FilePath($0) } ?? StateDirectory.default.appending("daemon") }
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the download daemon: an HTTP API, a web page, downloads that go on while clients come and go.",
        discussion: """
            Every API call needs the bearer token made on first start (saved, mode 0600, in the state \
            directory as 'token'). The web page is at the address printed. SIGTERM or SIGINT checkpoint \
            every download and exit; the next start resumes them.
            """)

    @Option(help: ArgumentHelp(
        "Address to listen on, HOST:PORT. Beyond loopback the token is still required, but the traffic is plain HTTP.",
        valueName: "host:port"))
    var listen = "127.0.0.1:\(Daemon.defaultPort)"

    @Option(name: [.short, .customLong("dir")], help: ArgumentHelp(
        "The download root: every file goes inside it (default: the current directory).", valueName: "dir"))
    var dir: String?

    @OptionGroup var daemonState: DaemonState

    @Option(name: [.short, .customLong("jobs")], help: ArgumentHelp(
        "Downloads at once, 1 to 64 (default: the saved setting, else 3).", valueName: "n"))
    var jobs: Int?

    @Option(help: ArgumentHelp(
        "Global speed limit in bytes per second, with an optional K, M or G (over the saved setting).", valueName: "rate"))
    var limitRate: String?

    @Option(help: ArgumentHelp(
        "fifo or lifo: which waiting download of equal priority starts first (over the saved setting).", valueName: "order"))
    var order: String?

    @Flag(help: ArgumentHelp(
        "Also speak aria2's JSON-RPC at /jsonrpc (HTTP and WebSocket) for AriaNg, aria2p and other aria2 clients; "
            + "the API token is aria2's secret."))
    var aria2Rpc = false

    @Option(help: ArgumentHelp(
        "A browser origin that may call /jsonrpc (repeat for more; * for any, as aria2's --rpc-allow-origin-all). "
            + "The secret is still required.", valueName: "origin"))
    var rpcAllowOrigin: [String] = []

    @OptionGroup var engine: EngineFlags

    @OptionGroup(title: "Hooks (also onComplete, onError, hookTimeout in the state directory's settings.json)")
    var hookFlags: HookFlags

    func validate() throws {
        guard !Validation.skipped else { return }
        guard Self.address(listen) != nil else { throw ValidationError("--listen must be HOST:PORT, e.g. 127.0.0.1:\(Daemon.defaultPort)") }
        if let jobs, !(1...64).contains(jobs) { throw ValidationError("--jobs must be between 1 and 64") }
        if let limitRate, Get.rate(limitRate) == nil {
            throw ValidationError("--limit-rate must be a number of bytes per second of at least 1K (1024), optionally with K, M or G")
        }
        if let order, QueueOrder(rawValue: order) == nil { throw ValidationError("--order must be fifo or lifo") }
        if !rpcAllowOrigin.isEmpty {
            guard aria2Rpc else { throw ValidationError("--rpc-allow-origin needs --aria2-rpc") }
            do throws(PickupError) { try Daemon.checkRPCOrigins(rpcAllowOrigin) } catch { throw ValidationError(error.description) }
        }
    }

    static func address(_ text: String) -> (host: String, port: Int)? {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port)
        else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return host.isEmpty ? nil : (host, port)
    }

    func run() async throws {
        let (host, port) = Self.address(listen)!
        var config = DaemonConfiguration(root: FilePath(dir ?? FileManager.default.currentDirectoryPath), stateDirectory: daemonState.path)
        config.host = host
        config.port = port
        config.maxConcurrentDownloads = jobs
        config.speedLimit = limitRate.flatMap(Get.rate)
        config.order = order.flatMap(QueueOrder.init(rawValue:))
        config.hooks = hookFlags.hooks
        config.aria2RPC = aria2Rpc
        config.rpcAllowOrigins = rpcAllowOrigin
        (config.engine, config.transport) = engine.settings()
        config.engine.multiplex = true  // a queue of files: HTTP/2 streams of one connection where offered
        let daemon: Daemon
        do {
            daemon = try Daemon(configuration: config)
        } catch {
            let message = if case .stateInUse = error {
                "another daemon is already running with its state in \(daemonState.path)"
            } else { "\(error)" }
            FileHandle.standardError.write(Data("pickup: \(message)\n".utf8))
            throw ExitCode(Get.code(for: error))
        }
        if daemon.tokenIsNew {
            Remote.say("pickup: new API token (saved in \(daemonState.path.appending("token"))): \(daemon.token)")
        }
        if !Daemon.isLoopback(host) {
            Remote.say("pickup: listening beyond loopback; every call needs the token, and the traffic is not encrypted")
        }
        do {
            try await daemon.run { url in
                Remote.say("pickup: serving \(daemon.root) at \(url)/ (state in \(daemonState.path))")
            }
        } catch {
            FileHandle.standardError.write(Data("pickup: \(Daemon.failure(error, listening: listen))\n".utf8))
            throw ExitCode(Exit.network)
        }
        Remote.say("pickup: stopped; every download is checkpointed")
    }
}
