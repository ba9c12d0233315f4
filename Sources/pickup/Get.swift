import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import Pickup
import PickupDaemon
import SystemPackage
import UnixSignals

struct Get: AsyncParsableCommand {
    // Every command names itself: otherwise ArgumentParser derives the name with
    // String(describing:), whose first dynamic casts cost about 2 ms at every start.
    static let configuration = CommandConfiguration(
        commandName: "get",
        abstract: "Download a URL to a file, resuming whatever an earlier run left.",
        discussion: """
            The bytes live in NAME.pickup-part with a NAME.pickup-ctl control file beside them until every \
            byte is there and verified; then the file appears at its path by an atomic rename. \
            Interrupt it any way you like and run the same command again to continue.
            """)

    @Argument(help: ArgumentHelp(
        "The http, https or ftp URL to download (or use -i). More URLs are mirrors of the same file: "
            + "its connections spread over them by speed, each mirror with its own validators (all must agree on the length); "
            + "with -Z each is a file of its own.",
        valueName: "url"))
    var urls: [String] = []

    /// The URL given first (the file's name and identity come from it).
    var url: String? { urls.first }

    @Option(name: [.short, .customLong("input-file")], help: ArgumentHelp(
        "Download every URL listed in this file (- reads standard input): one a line, # comments, an optional out=NAME after a URL. "
            + "Run the same command again to resume the batch; finished files are not fetched again.",
        valueName: "file"))
    var inputFile: String?

    @Option(help: ArgumentHelp(
        "Download the files a Metalink 4 file (RFC 5854) describes into -d, each verified with its strongest hash "
            + "(from its first URL by priority, for now). Run the same command again to resume.",
        valueName: "file"))
    var metalink: String?

    @Option(name: [.short, .customLong("jobs")], help: ArgumentHelp("With -i: downloads at once, 1 to 64.", valueName: "n"))
    var jobs: Int = 3

    @Option(name: [.short, .customLong("output")], help: ArgumentHelp(
        "Write exactly to this path. A file already there that pickup did not download from this URL is left alone and "
            + "the download stops (exit 6) before fetching, unless --overwrite. - writes the file to standard output "
            + "(one connection, nothing kept on disk, so nothing to resume in a later run).",
        valueName: "path"))
    var output: String?

    @Option(name: [.short, .customLong("dir")], help: ArgumentHelp(
        "Download into this directory, named by the server or the URL (default: the current directory).",
        valueName: "dir"))
    var dir: String?

    @Option(help: ArgumentHelp("Verify the finished file, e.g. sha-256=HEX (also sha-512, sha-1, md5).", valueName: "algo=hex"))
    var checksum: String?

    @Option(help: ArgumentHelp(
        "Speed limit in bytes per second, with an optional K, M or G (1024-based), e.g. 500K. With -i, over the whole batch.",
        valueName: "rate"))
    var limitRate: String?

    @Flag(inversion: .prefixedNo, help: ArgumentHelp(
        "When the URL answers with a Metalink document (Content-Type: application/metalink4+xml), download the files it "
            + "describes (into -d, or the one file to -o) instead of saving the document."))
    var followMetalink = true

    @Flag(help: ArgumentHelp(
        "Read no config file for this run (by default $XDG_CONFIG_HOME/pickup/pickup.conf, else ~/.config/pickup/pickup.conf: "
            + "one long option a line, e.g. connections = 4; the command line wins)."))
    var noConfig = false

    @Flag(help: "Discard any partial download and start from zero.")
    var restart = false

    @Flag(name: [.customShort("c"), .customLong("continue")], help: ArgumentHelp(
        "Does nothing: resuming is what pickup always does (accepted for wget's and aria2c's habit)."))
    var `continue` = false

    @Flag(name: [.customShort("Z"), .customLong("force-sequential")], help: ArgumentHelp(
        "Download each URL as a file of its own, one after another (a batch with -j 1; run it again to resume), "
            + "instead of as mirrors of one file."))
    var forceSequential = false

    @Flag(help: "Replace an existing file at the target: at -o PATH instead of stopping, with -d instead of choosing a free name.")
    var overwrite = false

    @Flag(name: [.short, .long], help: "Print nothing but errors.")
    var quiet = false

    @Flag(name: [.short, .long], help: ArgumentHelp(
        "Print the head of every request and response on standard error, numbered by request "
            + "(credentials, cookies and fields named like a token or key shown as [redacted])."))
    var verbose = false

    @Flag(help: "Print one JSON object per file on standard output when it ends (path, url, size, outcome, bytesTransferred, seconds, digest, error).")
    var json = false

    @OptionGroup(title: "Hooks") var hookFlags: HookFlags

    @OptionGroup var engine: EngineFlags

    @OptionGroup(title: "Headers, credentials and cookies") var http: RequestFlags

    func validate() throws {
        guard !Validation.skipped else { return }
        if output != nil && dir != nil { throw ValidationError("use either -o or -d, not both") }
        if dir == "" { throw ValidationError("-d needs a directory (\"\" names none; use . for the current one)") }
        if output == "" { throw ValidationError("-o needs a file name") }
        if [url != nil, inputFile != nil, metalink != nil].filter({ $0 }).count != 1 {
            // `get -o https://…`: the URL was taken for the option's value.
            if url == nil, let (name, value) = [("-o", output), ("-d", dir)].first(where: { $0.1?.contains("://") == true }) {
                throw ValidationError("\(name) took the URL \(DownloadURL.redacted(value ?? "")) for its value, and no URL is left "
                    + "to download (pickup get URL \(name) \(name == "-o" ? "PATH" : "DIR"))")
            }
            throw ValidationError("give a URL, -i FILE or --metalink FILE (one of them)")
        }
        if `continue`, restart { throw ValidationError("-c (continue) and --restart contradict each other") }
        if output == "-" {
            if urls.count > 1 { throw ValidationError("-o - streams one URL; mirrors and -Z need a file (use -o PATH or -d DIR)") }
            if json { throw ValidationError("--json prints on standard output, where -o - writes the file") }
            if hookFlags.onComplete != nil || hookFlags.onError != nil {
                throw ValidationError("--on-complete and --on-error are given the file's path; -o - has none")
            }
        }
        if forceSequential, urls.count > 1 {
            if output != nil { throw ValidationError("-o names one file; with -Z use -d") }
            if checksum != nil { throw ValidationError("--checksum is for one file, not for -Z") }
            if restart { throw ValidationError("--restart is for one file, not for -Z") }
        }
        if !(1...64).contains(jobs) { throw ValidationError("--jobs must be between 1 and 64") }
        if let list = inputFile != nil ? "-i" : metalink != nil ? "--metalink" : nil {
            if output != nil {
                throw ValidationError("-o names one file; with \(list) use -d" + (inputFile != nil ? " and out=NAME in the list" : ""))
            }
            if checksum != nil { throw ValidationError("--checksum is for one file, not for \(list)") }
            if restart { throw ValidationError("--restart is for one file, not for \(list)") }
        }
        if let checksum, ExpectedDigest(checksumArgument: checksum) == nil {
            throw ValidationError("--checksum must be ALGO=HEX with ALGO one of sha-256, sha-512, sha-1, md5 and HEX of the right length")
        }
        if let limitRate, Self.rate(limitRate) == nil {
            throw ValidationError("--limit-rate must be a number of bytes per second of at least 1K (1024), optionally with K, M or G")
        }
        if urls.count > 65 { throw ValidationError("at most 64 mirrors besides the first URL") }
        for url in urls {
            do { try DownloadURL.check(url) } catch { throw ValidationError(error.description) }
        }
    }

    func run() async throws {
        if let metalink { return try await Batch(get: self, inputFile: metalink, metalink: true).run() }
        guard let url else { return try await Batch(get: self, inputFile: inputFile ?? "").run() }
        if forceSequential, urls.count > 1 { return try await Batch(get: self, inputFile: "", urls: urls).run() }
        if output == "-" { return try await stream(url) }
        let destination: Destination =
            output.map { .file(FilePath($0)) } ?? .directory(FilePath(dir ?? "."))
        var request = DownloadRequest(
            url: url, destination: destination, checksum: checksum.flatMap(ExpectedDigest.init(checksumArgument:)),
            overwrite: overwrite, restart: restart,
            limiters: limitRate.flatMap(Self.rate).map { [RateLimiter(bytesPerSecond: $0)] } ?? [],
            options: try http.options(for: url), mirrors: Array(urls.dropFirst()))
        request.followMetalink = followMetalink
        let display = ProgressDisplay(quiet: quiet, name: output.flatMap { FilePath($0).lastComponent?.string } ?? ProgressDisplay.name(of: url))
        var (options, transport) = engine.settings()
        if verbose { transport.trace = { display.line($0) } }
        let downloader = Downloader(options: options, transport: transport)
        let signals = SignalTrap()
        let hooks = hookFlags.runner()

        let task = Task { try await downloader.download(request) { display.handle($0) } }
        // A signal stops the download, or the hook running after it (with its process group).
        await signals.onSignal { _ in
            task.cancel()
            hooks?.stop()
        }
        let result = await task.result
        await downloader.shutdown()
        display.clear()
        switch result {
        case .success(let r) where r.outcome == .metalink:
            guard let document = r.metalink else { throw ExitCode(Exit.failure) }
            if let sig = signals.received { throw ExitCode(sig == SIGTERM ? Exit.terminated : Exit.interrupted) }
            if !quiet {
                display.line("pickup: \(DownloadURL.redacted(url)) is a Metalink document describing \(document.files.count) "
                    + "file\(document.files.count == 1 ? "" : "s"); downloading \(document.files.count == 1 ? "it" : "them")")
            }
            return try await Batch(get: self, inputFile: url, document: document, trap: signals).run()
        case .success(let r):
            display.finished(r)
            if json {
                ResultLine(path: r.path.string, url: url, size: r.size, outcome: r.outcome == .unchanged ? "unchanged" : "downloaded",
                           bytesTransferred: r.bytesTransferred, seconds: r.elapsed, digest: r.digest).print()
            }
            hooks?.fire(HookEvent(path: r.path.string, url: url, size: r.size, completed: true))
            await hooks?.drain()
            if let sig = signals.received { throw ExitCode(sig == SIGTERM ? Exit.terminated : Exit.interrupted) }
        case .failure(let any):
            let error = (any as? PickupError) ?? .network("\(any)")
            if case .interrupted = error {
                let sig = signals.received ?? SIGINT
                display.line("pickup: interrupted; the partial download is kept. Run the same command again to resume.")
                throw ExitCode(sig == SIGTERM ? Exit.terminated : Exit.interrupted)
            }
            display.line("pickup: \(error)")
            if json { ResultLine(path: nil, url: url, size: nil, outcome: "failed", error: error.description).print() }
            hooks?.fire(HookEvent(path: nil, url: url, size: nil, completed: false, error: error.description))
            await hooks?.drain()
            if let sig = signals.received { throw ExitCode(sig == SIGTERM ? Exit.terminated : Exit.interrupted) }
            throw ExitCode(Self.code(for: error))
        }
    }

    /// `500K`, `2M`, `1G` or plain bytes, per second.
    static func rate(_ text: String) -> Int64? {
        guard let r = size(text), r >= RateLimiter.minimum else { return nil }
        return r
    }

    /// A byte count with an optional K, M or G (1024-based); nil when not a positive number.
    static func size(_ text: String) -> Int64? {
        let units: [Character: Double] = ["k": 1024, "m": 1024 * 1024, "g": 1024 * 1024 * 1024]
        var number = Substring(text)
        var scale = 1.0
        if let last = number.last?.lowercased().first, let u = units[last] {
            scale = u
            number = number.dropLast()
        }
        guard let n = Double(number), n * scale >= 1, n * scale < 1e18 else { return nil }
        return Int64(n * scale)
    }

    static func code(for error: PickupError) -> Int32 { code(for: error.category) }

    static func code(for category: PickupError.Category) -> Int32 {
        switch category {
        case .usage: Exit.usage
        case .network: Exit.network
        case .server: Exit.server
        case .verification: Exit.verification
        case .fileSystem: Exit.fileSystem
        case .interrupted: Exit.interrupted
        }
    }
}

/// Engine and HTTP options shared by `get` and `serve`.
struct EngineFlags: ParsableArguments {
    @Option(name: [.customShort("x"), .long], help: ArgumentHelp(
        "Connections per file, 1 to 32. More open only once the server answers a range request with a valid 206.",
        valueName: "n"))
    var connections: Int = 8

    @Flag(help: "Reserve the whole file on disk when its length is known, so a full disk shows at the start.")
    var preallocate = false

    @Flag(help: "Skip TLS certificate verification and allow https-to-http redirects.")
    var insecure = false

    @Option(help: ArgumentHelp("Seconds without a byte before a connection counts as stalled.", valueName: "seconds"))
    var stallTimeout: Double = 15

    @Option(help: ArgumentHelp("Attempts in a row without progress before giving up.", valueName: "n"))
    var retries: Int = 6

    @Option(help: ArgumentHelp(
        "Trust the certificates in this PEM file too (besides the system's; SSL_CERT_FILE and SSL_CERT_DIR are read as well).",
        valueName: "file"))
    var caCertificate: String?

    @Option(help: ArgumentHelp(
        "Send requests through this proxy: http://[user:password@]host:port (http and ftp URLs in absolute form, https through CONNECT), socks5:// or socks5h:// "
            + "(FTP's control and data connections too). Without it, http_proxy, https_proxy, ftp_proxy, all_proxy and no_proxy apply; \"\" turns proxies off.",
        valueName: "url"))
    var proxy: String?

    @Option(help: ArgumentHelp("Hosts to reach directly, comma-separated (a name covers its subdomains; * is every host).",
                               valueName: "list"))
    var noproxy: String?

    @Flag(help: "Through an HTTP proxy, tunnel http URLs with CONNECT too (as https always is) instead of sending them in absolute form; ftp and ftps URLs then go through CONNECT tunnels (control and data connections).")
    var proxytunnel = false

    @Option(help: ArgumentHelp("Refuse a file larger than this (K, M, G are 1024-based); a body without a length is stopped there.",
                               valueName: "size"))
    var maxSize: String?

    func validate() throws {
        guard !Validation.skipped else { return }
        if !Seconds.isValid(stallTimeout) { throw ValidationError("--stall-timeout must be a number of seconds above 0, at most 86400") }
        if !(1...32).contains(connections) { throw ValidationError("--connections must be between 1 and 32") }
        if !(0...1000).contains(retries) { throw ValidationError("--retries must be 0 to 1000") }
        do throws(PickupError) {
            _ = try ProxyRules.resolve(proxy: proxy, noProxy: noproxy, tunnel: proxytunnel, environment: ProcessInfo.processInfo.environment)
        } catch {
            throw ValidationError(error.description)
        }
        if let caCertificate {
            do throws(PickupError) { try HTTPClientTransport.checkCertificates(caCertificate) } catch { throw ValidationError(error.description) }
        }
        if let maxSize, Get.size(maxSize) == nil {
            throw ValidationError("--max-size must be a positive number of bytes, optionally with K, M or G")
        }
    }

    /// Engine and HTTP settings from the options.
    func settings() -> (DownloadOptions, HTTPClientTransport.Options) {
        var options = DownloadOptions()
        options.allowInsecureRedirects = insecure
        options.retry.maxAttemptsWithoutProgress = retries
        options.connections = connections
        options.preallocate = preallocate
        options.maxFileSize = maxSize.flatMap(Get.size)
        // A test hook: seconds between checkpoints (a test that must kill a run before its first
        // checkpoint sets it long, rather than racing a second on a loaded machine).
        if let seconds = ProcessInfo.processInfo.environment["PICKUP_TEST_CHECKPOINT_INTERVAL"].flatMap(Double.init), seconds > 0 {
            options.checkpointInterval = seconds
        }
        // A test hook: ranges in pieces over plain HTTP too (the torture test's server speaks it).
        if let p = ProcessInfo.processInfo.environment["PICKUP_TEST_PIECEWISE"], p == "0" || p == "1" { options.piecewise = p == "1" }
        var transport = HTTPClientTransport.Options()
        transport.insecure = insecure
        transport.stallTimeout = stallTimeout
        let env = ProcessInfo.processInfo.environment
        transport.extraTrustRoots = (caCertificate.map { [$0] } ?? []) + HTTPClientTransport.environmentTrustRoots(env)
        transport.proxies = (try? ProxyRules.resolve(proxy: proxy, noProxy: noproxy, tunnel: proxytunnel,
                                                     environment: ProcessInfo.processInfo.environment)) ?? ProxyRules()
        return (options, transport)
    }
}

/// Turns SIGINT and SIGTERM into a callback (once), so the download can checkpoint and exit.
/// The signals are watched through ServiceLifecycle's `UnixSignalsSequence` (dispatch sources,
/// registered before ``onSignal(_:)`` returns); their default actions are ignored first, so that
/// no signal ends the process between that and the registration.
final class SignalTrap: Sendable {
    private struct State {
        var handlers: [@Sendable (Int32) -> Void] = []
        var signal: Int32?
        var watching = false
    }
    private let state = NIOLockedValueBox(State())

    var received: Int32? { state.withLockedValue { $0.signal } }

    /// Calls `handler` at the first SIGINT or SIGTERM, or at once when one came already (a
    /// single download that turned into a batch hands its trap on: no signal falls between).
    func onSignal(_ handler: @escaping @Sendable (Int32) -> Void) async {
        let (already, start) = state.withLockedValue { s -> (Int32?, Bool) in
            defer { s.watching = true }
            if s.signal == nil { s.handlers.append(handler) }
            return (s.signal, !s.watching)
        }
        if let already { return handler(already) }
        guard start else { return }
        for sig in [SIGINT, SIGTERM] { Foundation.signal(sig, SIG_IGN) }
        let signals = await UnixSignalsSequence(trapping: .sigint, .sigterm)
        Task {
            for await sig in signals {
                let first = state.withLockedValue { s -> [@Sendable (Int32) -> Void] in
                    guard s.signal == nil else { return [] }
                    s.signal = sig.rawValue
                    return s.handlers
                }
                for handler in first { handler(sig.rawValue) }
            }
        }
    }
}
