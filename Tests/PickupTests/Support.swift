import Foundation
import Pickup
import SystemPackage
import TestServer

/// A temporary directory, removed when the value is released.
final class TempDir: @unchecked Sendable {
    let path: FilePath
    init() {
        let p = NSTemporaryDirectory() + "pickup-test-" + UUID().uuidString
        try! FileManager.default.createDirectory(atPath: p, withIntermediateDirectories: true)
        path = FilePath(p)
    }
    deinit { try? FileManager.default.removeItem(atPath: path.string) }

    func file(_ name: String) -> FilePath { path.appending(name) }
    func read(_ name: String) -> [UInt8]? { FileManager.default.contents(atPath: file(name).string).map(Array.init) }
    func write(_ name: String, _ bytes: [UInt8]) { _ = FileManager.default.createFile(atPath: file(name).string, contents: Data(bytes)) }
    var entries: [String] { ((try? FileManager.default.contentsOfDirectory(atPath: path.string)) ?? []).sorted() }
}

/// A property test's seed: `variable` from the environment (to replay a run), else a new one;
/// printed either way, with `test`'s name.
func propertySeed(_ variable: String, _ test: String) -> UInt64 {
    let seed = ProcessInfo.processInfo.environment[variable].flatMap { UInt64($0) } ?? UInt64.random(in: 1...UInt64(UInt32.max))
    print("\(test): seed \(seed) (replay with \(variable)=\(seed))")
    return seed
}

/// Collects notices and progress for assertions.
final class EventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var _notices: [String] = []
    private var _progress: [DownloadProgress] = []
    var notices: [String] { lock.withLock { _notices } }
    var progress: [DownloadProgress] { lock.withLock { _progress } }
    func record(_ e: DownloadEvent) {
        lock.withLock {
            switch e {
            case .notice(let n): _notices.append(n)
            case .progress(let p): _progress.append(p)
            }
        }
    }
}

/// Engine options tuned for tests: short backoff, frequent progress and checkpoints, state in its own directory.
func testOptions(state: FilePath, retries: Int = 6, connections: Int = 1, backoff: Double = 0.01) -> DownloadOptions {
    var options = DownloadOptions()
    options.connections = connections
    options.minSplitSize = 64 * 1024
    options.retry = RetryPolicy(maxAttemptsWithoutProgress: retries, baseDelay: backoff, maxDelay: backoff * 5)
    options.stateDirectory = state
    options.progressInterval = 0.02
    options.checkpointInterval = 0.1
    // Tests run in parallel in one process (servers included), so its CPU time says nothing of
    // one download; the tuner's own tests stand in a clock.
    options.adaptiveConnections = false
    // Ranges in pieces over the test server's plain HTTP too (by default over https only), so the
    // engine's tests exercise them.
    options.piecewise = true
    return options
}

/// How many times its idle-machine figure the tests' stall and connect timeouts are: 4 unless
/// `PICKUP_TEST_TIMEOUT_SCALE` says (1 for the quickest run on an idle machine). A CI machine's
/// two loaded cores hold a process for a second at times: with a stall timeout of 0.5 s a slow
/// response head was taken for a stall there, and the fault the server had sent in it (a 404
/// meant to end the run) went to a request the client had given up on.
let testTimeoutScale: Double = {
    let v = ProcessInfo.processInfo.environment["PICKUP_TEST_TIMEOUT_SCALE"].flatMap(Double.init) ?? 4
    return v.isFinite && v > 0 ? min(v, 100) : 4
}()

/// Transport options tuned for tests: stalls noticed quickly (`stall` seconds on an idle machine,
/// times ``testTimeoutScale``).
func testTransport(stall: Double = 0.5) -> HTTPClientTransport.Options {
    var transport = HTTPClientTransport.Options()
    transport.stallTimeout = stall * testTimeoutScale
    transport.connectTimeout = 2 * testTimeoutScale
    return transport
}

/// A downloader tuned for tests.
func testDownloader(state: FilePath, stall: Double = 0.5, retries: Int = 6, connections: Int = 1, backoff: Double = 0.01) -> Downloader {
    Downloader(options: testOptions(state: state, retries: retries, connections: connections, backoff: backoff),
               transport: testTransport(stall: stall))
}

/// What a test sets up and tears down: used through ``run(_:)``, so the tear-down happens
/// however the test ends (a failed `#require`, a thrown error), and nothing a test started goes
/// on after it.
protocol TestFixture: AnyObject, Sendable {
    func close() async
}

extension TestFixture {
    /// Runs `body` with this fixture (on the caller's actor), then closes it, also when `body` throws.
    func run<T>(isolation: isolated (any Actor)? = #isolation, _ body: (Self) async throws -> T) async throws -> T {
        let result: T
        do {
            result = try await body(self)
        } catch {
            await close()
            throw error
        }
        await close()
        return result
    }
}

/// One test's world: a server, a download directory, a state directory and a downloader.
final class Fixture: TestFixture, @unchecked Sendable {
    let server: TestServer
    let dir = TempDir()
    let state = TempDir()
    let downloader: Downloader
    let events = EventLog()

    init(stall: Double = 0.5, retries: Int = 6, connections: Int = 1, backoff: Double = 0.01) async throws {
        server = try await TestServer.start()
        downloader = testDownloader(state: state.path, stall: stall, retries: retries, connections: connections, backoff: backoff)
    }

    func get(_ path: String, to destination: Destination? = nil, checksum: ExpectedDigest? = nil, overwrite: Bool = false,
             restart: Bool = false) async throws(PickupError) -> DownloadResult {
        let events = self.events
        return try await downloader.download(
            DownloadRequest(url: server.url(path), destination: destination ?? .directory(dir.path), checksum: checksum,
                            overwrite: overwrite, restart: restart)) { events.record($0) }
    }

    /// Starts downloading `path` in the background and returns once more than `bytes` are held
    /// (waiting on the progress events, not on a clock).
    func startInBackground(_ path: String, after bytes: Int64) async -> Task<DownloadResult, any Error> {
        let (progressed, signal) = AsyncStream<Void>.makeStream()
        let task = Task { [downloader, server, dir] in
            try await downloader.download(DownloadRequest(url: server.url(path), destination: .directory(dir.path))) {
                if case .progress(let p) = $0, p.bytesDone > bytes { signal.yield() }
            }
        }
        for await _ in progressed { break }
        return task
    }

    func close() async {
        await downloader.shutdown()
        await server.stop()
    }
}
