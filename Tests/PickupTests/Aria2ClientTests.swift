import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
@testable import PickupDaemon
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// The Python with aria2p that `.ci/run` installs (`PICKUP_ARIA2P_PYTHON` overrides it).
enum Aria2p {
    static let version = "0.12.3"
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static var python: String {
        ProcessInfo.processInfo.environment["PICKUP_ARIA2P_PYTHON"]
            ?? repository.appendingPathComponent(".build/venv-aria2p/bin/python").path
    }
    static var script: String { repository.appendingPathComponent("Tests/aria2p/drive.py").path }
    static let setup = "python3 -m venv .build/venv-aria2p && .build/venv-aria2p/bin/pip install aria2p==\(version) (the venv step of .ci/run)"

    /// Runs `python drive.py args` to its end (bounded: killed after `seconds`); its exit status
    /// (-1 when it had to be killed) and output.
    static func run(_ args: [String], seconds: Double = 240) async throws -> (status: Int32, output: String) {
        let out = TempDir()
        let log = out.file("out.txt")
        _ = FileManager.default.createFile(atPath: log.string, contents: nil)
        var env = ProcessInfo.processInfo.environment
        for name in CLI.proxyVariables { env[name] = nil }
        env["PYTHONUNBUFFERED"] = "1"
        let p = try await Child.start(python, [script] + args, environment: env, workingDirectory: out.path.string,
                                      output: .file(log.string), errors: .sameAsOutput)
        defer { p.kill() }
        let ended = await eventually(seconds: seconds, every: 0.05) { !p.isRunning }
        if !ended { p.signal(SIGKILL) }
        let status = await p.wait()
        let text = String(decoding: FileManager.default.contents(atPath: log.string) ?? Data(), as: UTF8.self)
        return (ended ? status.code : -1, text)
    }
}

/// Skipped without the venv, as the other tests that need a tool are, except under `.ci/run`
/// (PICKUP_CI=1), which makes it: there a missing venv fails the test.
@Suite(.serialized, .timeLimit(.minutes(5)),
       .enabled(if: FileManager.default.isExecutableFile(atPath: Aria2p.python) || ProcessInfo.processInfo.environment["PICKUP_CI"] == "1",
                "no Python with aria2p: run .ci/run's venv step"))
struct Aria2ClientTests {
    /// aria2p (from PyPI, pinned in .ci/run) against a real `pickup serve --aria2-rpc`: add, list,
    /// pause, resume, options, stats, multicall, remove (the partial file kept), purge, and the
    /// WebSocket notifications (a raw client and aria2p's listener) of a download from the test
    /// server run to its end.
    @Test func aria2pDrivesTheDaemonAsItDrivesAria2c() async throws {
        #expect(FileManager.default.isExecutableFile(atPath: CLI.binary), "build the pickup binary first")
        try #require(FileManager.default.isExecutableFile(atPath: Aria2p.python),
                     "no Python with aria2p at \(Aria2p.python): run \(Aria2p.setup), or set PICKUP_ARIA2P_PYTHON")
        let server = try await TestServer.start()
        let root = TempDir(), state = TempDir()
        let fast = Resource.bytes(count: 2_000_000, seed: 71)
        // Slow enough never to finish while the script runs, however loaded the machine (16 MB at 50 KB/s).
        server.set("/slow.bin", Resource(body: Resource.bytes(count: 16_000_000, seed: 72), bytesPerSecond: 50_000))
        server.set("/fast.bin", Resource(body: fast))
        let daemon = try await ServeProcess.start(root: root, state: state, ["--aria2-rpc"])
        defer { daemon.stopIfRunning() }
        do {
            let port = try #require(URL(string: daemon.client.baseURL)?.port)
            let token = try #require(DaemonFiles(directory: state.path).readToken())
            let (status, output) = try await Aria2p.run([
                "--port", String(port), "--secret", token, "--root", root.path.string,
                "--slow", server.url("/slow.bin"), "--fast", server.url("/fast.bin"), "--fast-size", String(fast.count),
            ])
            #expect(status == 0, "drive.py failed:\n\(output)")
            #expect(output.contains("ok notification onDownloadComplete"), "\(output)")
            #expect(output.hasSuffix("ALL OK\n"), "\(output)")
            #expect(!output.contains(token), "the secret was shown")
            let same = root.read("fast.bin") == fast
            #expect(same, "fast.bin is not the server's file")
            #expect(await daemon.signal(SIGTERM).exited)
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }
}

/// `/jsonrpc` in a daemon in this process: the secret, the answers' HTTP statuses, the origin
/// rule (and the REST API's, unchanged), the GET form, the bounds, a removed download's result
/// and GIDs that survive a restart.
@Suite(.timeLimit(.minutes(3))) struct Aria2HTTPTests {
    static let origin = "http://ariang.example"

    func withDaemon(_ body: (DaemonFixture) async throws -> Void) async throws {
        try await DaemonFixture { config in
            config.aria2RPC = true
            config.rpcAllowOrigins = [Self.origin]
        }.run(body)
    }

    func rpc(_ f: DaemonFixture, _ method: String, secret: Bool = true, _ params: [RPCValue] = [],
             headers: [(String, String)] = []) async throws -> (status: Int, value: RPCValue?) {
        let all = secret ? [RPCValue.string("token:\(f.daemon.token)")] + params : params
        let body = RPCValue.object(["jsonrpc": .string("2.0"), "id": .string("t"), "method": .string(method), "params": .array(all)])
        let r = try await f.raw(.POST, "/jsonrpc", headers: headers, body: String(decoding: body.json, as: UTF8.self))
        return (r.status, try? JSONDecoder().decode(RPCValue.self, from: Data(r.body.utf8)))
    }

    func result(_ f: DaemonFixture, _ method: String, _ params: [RPCValue] = []) async throws -> RPCValue {
        let r = try await rpc(f, method, params)
        guard r.status == 200, let result = r.value?.object?["result"] else {
            throw CocoaError(.fileReadUnknown, userInfo: [NSLocalizedDescriptionKey: "\(method): \(r)"])
        }
        return result
    }

    @Test func theSecretIsRequiredAndErrorsAreAria2s() async throws {
        try await withDaemon { f in
            let denied = try await rpc(f, "aria2.getGlobalStat", secret: false)
            #expect(denied.status == 400)
            #expect(denied.value?.object?["error"] == .object(["code": .int(1), "message": .string("Unauthorized")]))
            let wrong = try await rpc(f, "aria2.tellActive", secret: false, [.string("token:nope")])
            #expect(wrong.value?.object?["error"]?.object?["message"] == .string("Unauthorized"))
            // An unknown method is refused only after the secret (as aria2 does).
            #expect(try await rpc(f, "aria2.nope", secret: false).value?.object?["error"]?.object?["message"] == .string("Unauthorized"))
            #expect(try await rpc(f, "aria2.nope").value?.object?["error"]?.object?["message"] == .string("No such method: aria2.nope"))
            let methods = try await rpc(f, "system.listMethods", secret: false)
            #expect(methods.value?.object?["result"]?.array?.contains(.string("aria2.addUri")) == true)
            let bad = try await f.raw(.POST, "/jsonrpc", body: "{not json")
            #expect(bad.status == 500)
            #expect(bad.body.contains("-32700"))
            #expect(try await f.raw(.POST, "/jsonrpc", body: #"{"id":1}"#).status == 400)
            // A batch answers each request, 200.
            let batch = try await f.raw(.POST, "/jsonrpc", body: #"[{"id":1,"method":"system.listNotifications"},{"id":2,"method":"aria2.getVersion"}]"#)
            #expect(batch.status == 200)
            let answers = try JSONDecoder().decode(RPCValue.self, from: Data(batch.body.utf8)).array
            #expect(answers?.count == 2)
            #expect(answers?.last?.object?["error"]?.object?["message"] == .string("Unauthorized"))
            // Bounded: a body over the limit is refused before it is read whole.
            let huge = try await f.raw(.POST, "/jsonrpc", body: String(repeating: " ", count: Aria2Service.maxBody + 1))
            #expect(huge.status == 413)
            // Multicall: each call with its own secret, one level deep.
            let token = RPCValue.string("token:\(f.daemon.token)")
            // (No secret of its own: each call carries its own, as aria2 has it.)
            let multi = try await rpc(f, "system.multicall", secret: false, [.array([
                .object(["methodName": .string("aria2.getVersion"), "params": .array([token])]),
                .object(["methodName": .string("aria2.getVersion"), "params": .array([])]),
                .object(["methodName": .string("system.multicall"), "params": .array([])]),
            ])]).value?.object?["result"]
            #expect(multi?.array?.count == 3)
            #expect(multi?.array?[0].array?.first?.object?["version"] != nil)
            #expect(multi?.array?[1].object?["message"] == .string("Unauthorized"))
            #expect(multi?.array?[2].object?["message"] == .string("Recursive system.multicall forbidden."))
            // GET with a base64 query, as aria2 takes it.
            let params = Data(#"["token:\#(f.daemon.token)"]"#.utf8).base64EncodedString()
            let got = try await f.raw(.GET, "/jsonrpc?method=aria2.getGlobalStat&id=g&params=" + params.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)
            #expect(got.status == 200)
            #expect(got.body.contains("numActive"))
            #expect(try await f.raw(.GET, "/jsonrpc?method=aria2.getVersion&id=1&jsoncallback=cb").status == 400)
        }
    }

    @Test func listedOriginsMayCallWithCORSAndOthersAreRefusedTheRESTAPIUnchanged() async throws {
        try await withDaemon { f in
            let preflight = try await f.raw(.OPTIONS, "/jsonrpc", headers: [("Origin", Self.origin), ("Access-Control-Request-Method", "POST"),
                                                                            ("Access-Control-Request-Headers", "content-type")])
            #expect(preflight.status == 200)
            #expect(preflight.headers["Access-Control-Allow-Origin"].first == Self.origin)
            #expect(preflight.headers["Access-Control-Allow-Headers"].first == "content-type")
            #expect(preflight.headers["Access-Control-Allow-Methods"].first?.contains("POST") == true)
            let foreign = try await f.raw(.OPTIONS, "/jsonrpc", headers: [("Origin", "http://evil.example"), ("Access-Control-Request-Method", "POST")])
            #expect(foreign.status == 403)
            #expect(foreign.headers["Access-Control-Allow-Origin"].isEmpty)

            let allowed = try await rpc(f, "aria2.getGlobalStat", headers: [("Origin", Self.origin)])
            #expect(allowed.status == 200)
            let listed = try await f.raw(.POST, "/jsonrpc", headers: [("Origin", Self.origin)], body: #"{"id":1,"method":"system.listMethods"}"#)
            #expect(listed.headers["Access-Control-Allow-Origin"].first == Self.origin)
            #expect(try await rpc(f, "aria2.getGlobalStat", headers: [("Origin", "http://evil.example")]).status == 403)
            // The secret is still required from a listed origin.
            #expect(try await rpc(f, "aria2.getGlobalStat", secret: false, headers: [("Origin", Self.origin)]).status == 400)
            // DNS rebinding: another Host is refused here as on the REST API.
            #expect(try await rpc(f, "aria2.getGlobalStat", headers: [("Host", "rebound.example")]).status == 403)
            // The REST API's rule is as before: no cross-origin call, even from a listed origin.
            let rest = try await f.raw(.GET, "/api/v1/downloads", headers: [("Origin", Self.origin)], token: f.daemon.token)
            #expect(rest.status == 403)
            #expect(rest.headers["Access-Control-Allow-Origin"].isEmpty)
        }
    }

    @Test func removeKeepsThePartialFileAsAResultUntilPurgedAndGIDsSurviveARestart() async throws {
        try await withDaemon { f in
            // Never done within the test, however loaded the machine (8 MB at 50 KB/s).
            f.server.set("/slow.bin", Resource(body: Resource.bytes(count: 8_000_000, seed: 81), bytesPerSecond: 50_000))
            f.server.set("/done.bin", Resource(body: Resource.bytes(count: 100_000, seed: 82)))
            let url = f.server.url("/slow.bin").replacingOccurrences(of: "http://", with: "http://user:hush@")
            let gid = try #require(try await result(f, "aria2.addUri", [.array([.string(url)]), .object(["out": .string("slow.bin")])]).string)
            #expect(gid.count == 16)
            let done = try #require(try await result(f, "aria2.addUri", [.array([.string(f.server.url("/done.bin"))])]).string)
            #expect(await eventually {
                FileManager.default.fileExists(atPath: f.root.file("slow.bin.pickup-part").string)
            })
            try await f.waitUntil { $0.values.contains { $0.state == "completed" } }
            let status = try await result(f, "aria2.tellStatus", [.string(gid)])
            #expect(!String(decoding: status.json, as: UTF8.self).contains("hush"), "credentials shown: \(status)")
            #expect(status.object?["files"]?.array?.first?.object?["path"] == .string(f.daemon.root.appending("slow.bin").string))

            // GIDs are the downloads' ids: the same after a restart.
            await f.stop()
            try await f.start()
            #expect(try await result(f, "aria2.tellStatus", [.string(gid), .array([.string("gid")])]) == .object(["gid": .string(gid)]))
            #expect(try await result(f, "aria2.tellStatus", [.string(done), .array([.string("status")])])
                == .object(["status": .string("complete")]))

            #expect(try await result(f, "aria2.remove", [.string(gid)]) == .string(gid))
            #expect(FileManager.default.fileExists(atPath: f.root.file("slow.bin.pickup-part").string), "remove keeps the partial file")
            #expect(try await result(f, "aria2.tellStatus", [.string(gid), .array([.string("status")])])
                == .object(["status": .string("removed")]))
            let stopped = try await result(f, "aria2.tellStopped", [.int(0), .int(10), .array([.string("gid"), .string("status")])])
            #expect(stopped.array?.contains(.object(["gid": .string(gid), "status": .string("removed")])) == true)
            #expect(try await rpc(f, "aria2.remove", [.string(gid)]).status == 400)
            #expect(try await result(f, "aria2.purgeDownloadResult") == .string("OK"))
            #expect(try await result(f, "aria2.tellStopped", [.int(0), .int(10)]) == .array([]))
            #expect(try await rpc(f, "aria2.tellStatus", [.string(done)]).status == 400)
            #expect(f.root.read("done.bin")?.count == 100_000, "purging deletes no file")
            #expect(try await f.client.list().isEmpty)
        }
    }
}
