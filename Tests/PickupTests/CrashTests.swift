import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// Runs the real `pickup` binary and kills it with SIGKILL mid-download.
enum CLI {
    static var binary: String {
        // The test bundle sits beside the products in .build/<config>/.
        var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        while dir.path != "/" {
            let candidate = dir.appendingPathComponent("pickup").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            dir = dir.deletingLastPathComponent()
        }
        return "pickup"
    }

    static func start(_ args: [String], state: FilePath, environment: [String: String] = [:]) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binary)
        p.arguments = args
        var env = ProcessInfo.processInfo.environment
        for name in ["http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"] { env[name] = nil }
        env.merge(environment) { $1 }
        env["PICKUP_STATE_DIR"] = state.string
        p.environment = env
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        return p
    }

    static func run(_ args: [String], state: FilePath, environment: [String: String] = [:]) throws -> Int32 {
        let p = try start(args, state: state, environment: environment)
        p.waitUntilExit()
        return p.terminationStatus
    }

    /// Waits (bounded) until `condition` holds, polling; returns whether it did.
    static func waitFor(seconds: Double = 60, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition() { return true }
            usleep(10_000)
        }
        return condition()
    }

    /// Starts `pickup get`, waits until the control file claims more than `after` bytes and
    /// `moreThanDurable` says enough has arrived since, then SIGKILLs it. Returns the durable bytes then.
    static func killMidway(_ args: [String], state: FilePath, control: FilePath, after: Int64,
                           moreThanDurable: (Int64) -> Bool = { _ in true }) throws -> Int64 {
        let p = try start(args, state: state)
        defer { if p.isRunning { kill(p.processIdentifier, SIGKILL) }; p.waitUntilExit() }
        var durable: Int64 = 0
        let reached = waitFor {
            durable = ControlFile.load(control)?.durableBytes ?? 0
            return durable > after && moreThanDurable(durable)
        }
        #expect(reached, "the download did not get past \(after) bytes")
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        #expect(p.terminationReason == .uncaughtSignal)
        return ControlFile.load(control)?.durableBytes ?? 0
    }
}

@Suite(.serialized) struct CrashTests {
    /// SIGKILLs `pickup get -x connections` three times mid-download, reruns to the end, and checks
    /// the bytes and how much was fetched twice.
    @Test(arguments: [1, 16])
    func sigkillMidDownloadThenRerunIsByteExactAndRefetchesLittle(connections: Int) async throws {
        #expect(FileManager.default.isExecutableFile(atPath: CLI.binary), "build the pickup binary first")
        let server = try await TestServer.start()
        // About four seconds of transfer either way, so that three kills fit (a resumed run opens all
        // its connections again).
        let size = connections == 1 ? 12 * 1024 * 1024 : 40 * 1024 * 1024
        let body = Resource.bytes(count: size, seed: 42)
        let rate = connections == 1 ? 3 * 1024 * 1024 : 640 * 1024  // per connection
        server.set("/big.iso", Resource(body: body, bytesPerSecond: rate))
        let dir = TempDir(), state = TempDir()
        let out = dir.file("big.iso")
        let args = ["get", server.url("/big.iso"), "-o", out.string, "--quiet", "-x", "\(connections)"]
        let control = FilePath(out.string + ".pickup-ctl")

        var last: Int64 = 0
        var kills = 0
        for step in 1...3 {
            // Kill once this run is past a checkpoint and about half a second has arrived since.
            let sentBefore = Int64(server.bytesSent("/big.iso")), durableBefore = last
            let durable = try CLI.killMidway(args, state: state.path, control: control, after: last + Int64(size / 8)) {
                Int64(server.bytesSent("/big.iso")) - sentBefore > ($0 - durableBefore) + Int64(rate * connections / 2)
            }
            _ = step
            #expect(durable >= last, "durable progress never goes backwards")
            #expect(ControlFile.load(control)?.segments.count ?? 0 >= connections, "every range is in the control file")
            last = durable
            kills += 1
        }
        server.update("/big.iso") { $0.bytesPerSecond = nil }
        #expect(try CLI.run(args, state: state.path) == 0)
        #expect(dir.read("big.iso") == body)
        #expect(dir.entries == ["big.iso"])
        let waste = server.bytesSent("/big.iso") - body.count
        let perSecond = rate * connections
        print("crash test (\(connections) connections): \(kills) kills, \(waste) bytes fetched twice, \(String(format: "%.2f", Double(waste) / Double(perSecond * kills))) s of transfer per kill")
        // Each kill may lose what arrived since the last checkpoint (1 s); a generous bound, not a timing assert.
        #expect(waste <= kills * perSecond * 2)
        let requests = server.requests("/big.iso")
        #expect(requests.dropFirst().allSatisfy { $0.headers["range"] == "bytes=0-" || $0.headers["if-range"] == "\"v1\"" })
        await server.stop()
    }

    @Test func exitCodesAreDocumentedOnes() async throws {
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir()
        #expect(try CLI.run(["get", "ftp://example.com/x", "-d", dir.path.string], state: state.path) == 2)
        #expect(try CLI.run(["get", server.url("/x"), "-o", "a", "-d", "b"], state: state.path) == 2)
        #expect(try CLI.run(["get", server.url("/x"), "--checksum", "sha-256=zz"], state: state.path) == 2)
        #expect(try CLI.run(["get", server.url("/x"), "--limit-rate", "fast"], state: state.path) == 2)
        #expect(try CLI.run(["get", server.url("/x"), "-i", "list.txt"], state: state.path) == 2)
        #expect(try CLI.run(["get", server.url("/missing"), "-d", dir.path.string, "-q"], state: state.path) == 4)
        server.set("/a", Resource(body: [1, 2, 3]))
        let wrong = "md5=" + String(repeating: "0", count: 32)
        #expect(try CLI.run(["get", server.url("/a"), "-d", dir.path.string, "-q", "--checksum", wrong], state: state.path) == 5)
        #expect(try CLI.run(["get", "http://127.0.0.1:1/a", "-d", dir.path.string, "-q", "--retries", "1"], state: state.path) == 3)
        #expect(try CLI.run(["get", server.url("/a"), "-d", "/proc/pickup-cannot-write-here", "-q"], state: state.path) == 6)
        await server.stop()
    }

    @Test func versionIsPrintedAndExitsZero() throws {
        let result = try CLI.output(["--version"])
        #expect(result.status == 0)
        #expect(result.text == PickupVersion.string + "\n")
    }

    @Test func sigtermCheckpointsAndExitsWithItsCode() async throws {
        let server = try await TestServer.start()
        let body = Resource.bytes(count: 8 * 1024 * 1024, seed: 5)
        server.set("/t.bin", Resource(body: body, bytesPerSecond: 2 * 1024 * 1024))
        let dir = TempDir(), state = TempDir()
        let out = dir.file("t.bin")
        let p = try CLI.start(["get", server.url("/t.bin"), "-o", out.string, "-q", "-x", "1"], state: state.path)
        #expect(CLI.waitFor { (FS.size(FilePath(out.string + ".pickup-part")) ?? 0) > 500_000 })
        kill(p.processIdentifier, SIGTERM)
        p.waitUntilExit()
        #expect(p.terminationStatus == 143)
        let held = ControlFile.load(FilePath(out.string + ".pickup-ctl"))?.durableBytes ?? 0
        #expect(held > 500_000)
        server.update("/t.bin") { $0.bytesPerSecond = nil }
        #expect(try CLI.run(["get", server.url("/t.bin"), "-o", out.string, "-q", "-x", "1"], state: state.path) == 0)
        #expect(dir.read("t.bin") == body)
        // A clean stop keeps every byte it received: the rerun asks for exactly the rest.
        #expect(server.requests("/t.bin").last?.headers["range"] == "bytes=\(held)-\(body.count - 1)")
        await server.stop()
    }
}
