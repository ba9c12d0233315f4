import Foundation
import PickupDaemon
import SystemPackage
import Testing
import TestServer

@testable import Pickup

extension CLI {
    /// Runs `pickup` with its state in `state`; returns the exit status, standard output and error.
    static func capture(_ args: [String], state: FilePath, environment: [String: String] = [:]) async throws -> (status: Int32, out: String, err: String) {
        let r = try await captureBytes(args, state: state, environment: environment)
        return (r.status, String(decoding: r.out, as: UTF8.self), r.err)
    }

    /// As ``capture(_:state:environment:)``, with standard output's bytes as they are and `input`
    /// on standard input (else none: /dev/null).
    static func captureBytes(_ args: [String], state: FilePath, environment: [String: String] = [:], input: [UInt8]? = nil)
        async throws -> (status: Int32, out: Data, err: String)
    {
        let p = try await start(args, state: state, environment: environment, input: input.map { .bytes($0) } ?? .null,
                                output: .captured, errors: .captured)
        let r = await p.finish()
        return (r.status.code, Data(r.output), r.errorText)
    }
}

/// A hook script that appends its outcome, size, first argument, URL and error to `log`, then
/// exits with `status` (or becomes `sleep` for that many seconds).
func writeHook(in dir: TempDir, log: FilePath, status: Int = 0, sleep: Int = 0) -> FilePath {
    let late = sleep > 0 ? "exec sleep \(sleep)\n" : ""
    dir.write("hook.sh", Array("#!/bin/sh\necho \"$PICKUP_OUTCOME|$PICKUP_SIZE|$1|$PICKUP_URL|$PICKUP_ERROR\" >> \(log.string)\n\(late)exit \(status)\n".utf8))
    chmod(dir.file("hook.sh").string, 0o755)
    return dir.file("hook.sh")
}

func lines(_ path: FilePath) -> [String] {
    ((try? String(contentsOfFile: path.string, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
}

func jsonObjects(_ text: String) throws -> [[String: Any]] {
    try text.split(separator: "\n").map { try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]) }
}

@Suite(.serialized, .timeLimit(.minutes(3))) struct ScriptingTests {
    /// `get --json` prints one object per file; hooks run without a shell with what they need; a
    /// failing hook fails nothing.
    @Test func getPrintsJSONAndRunsItsHooks() async throws {
        let server = try await TestServer.start()
        let body = Resource.bytes(count: 300_000, seed: 3)
        server.set("/j.bin", Resource(body: body))
        let dir = TempDir(), state = TempDir(), scripts = TempDir()
        let log = scripts.file("log")
        let hook = writeHook(in: scripts, log: log, status: 1)
        let out = dir.file("j.bin")
        let sha = MetalinkCLITests.sha256(body)
        let args = ["get", server.url("/j.bin"), "-o", out.string, "-q", "--json", "--on-complete", hook.string,
                    "--on-error", hook.string, "--checksum", "sha-256=\(sha)"]
        let first = try await CLI.capture(args, state: state.path)
        #expect(first.status == 0, "a failing hook fails nothing: \(first.err)")
        #expect(first.err.contains("hook \(hook.string) exited with status 1"))
        let o = try #require(try jsonObjects(first.out).first)
        #expect(o["path"] as? String == out.string)
        #expect(o["url"] as? String == server.url("/j.bin"))
        #expect((o["size"] as? NSNumber)?.intValue == body.count)
        #expect(o["outcome"] as? String == "downloaded")
        #expect((o["bytesTransferred"] as? NSNumber)?.intValue == body.count)
        #expect(o["seconds"] is NSNumber)
        #expect(o["digest"] as? String == "sha-256=\(sha)")
        #expect(lines(log) == ["completed|\(body.count)|\(out.string)|\(server.url("/j.bin"))|"])
        // Again: unchanged, nothing transferred.
        let again = try jsonObjects(try await CLI.capture(args, state: state.path).out)
        #expect(again.first?["outcome"] as? String == "unchanged")
        #expect((again.first?["bytesTransferred"] as? NSNumber)?.intValue == 0)
        // A failure: its own line, the error hook, the failure's exit code.
        let failed = try await CLI.capture(["get", server.url("/none.bin"), "-d", dir.path.string, "-q", "--json", "--on-error", hook.string],
                                     state: state.path)
        #expect(failed.status == 4)
        let f = try #require(try jsonObjects(failed.out).first)
        #expect(f["outcome"] as? String == "failed")
        #expect(f["path"] is NSNull)
        #expect((f["error"] as? String)?.contains("404") == true)
        #expect(lines(log).last?.hasPrefix("failed||||") == false)
        #expect(lines(log).last?.hasPrefix("failed|||\(server.url("/none.bin"))|") == true)
        await server.stop()
    }

    /// A hook that runs too long is stopped and reported; the download's command ends anyway.
    @Test func aHookPastItsTimeoutIsStopped() async throws {
        let server = try await TestServer.start()
        server.set("/t.bin", Resource(body: Resource.bytes(count: 1000)))
        let dir = TempDir(), state = TempDir(), scripts = TempDir()
        let log = scripts.file("log")
        let hook = writeHook(in: scripts, log: log, sleep: 60)
        let r = try await CLI.capture(["get", server.url("/t.bin"), "-d", dir.path.string, "-q", "--on-complete", hook.string,
                                 "--hook-timeout", "1"], state: state.path)
        #expect(r.status == 0)
        #expect(r.err.contains("ran out of time"))
        #expect(lines(log).count == 1, "the hook ran: \(lines(log))")
        #expect(try await CLI.capture(["get", server.url("/t.bin"), "-d", dir.path.string, "--on-complete", "/nonexistent/hook"],
                                state: state.path).status == 2)
        await server.stop()
    }

    /// `get -i --json`: a line per file as each ends; hooks for each.
    @Test func aBatchPrintsALinePerFileAndRunsHooksForEach() async throws {
        let server = try await TestServer.start()
        let bodies = (0..<3).map { Resource.bytes(count: 50_000 + $0, seed: UInt64($0)) }
        for (i, b) in bodies.enumerated() { server.set("/b/\(i)", Resource(body: b)) }
        let dir = TempDir(), state = TempDir(), scripts = TempDir()
        let log = scripts.file("log")
        let hook = writeHook(in: scripts, log: log)
        scripts.write("list.txt", Array(((0..<3).map { server.url("/b/\($0)") + " out=f\($0)" } + [server.url("/missing")])
            .joined(separator: "\n").utf8))
        let r = try await CLI.capture(["get", "-i", scripts.file("list.txt").string, "-d", dir.path.string, "-q", "--json",
                                 "--on-complete", hook.string, "--on-error", hook.string], state: state.path)
        #expect(r.status == 4)
        let objects = try jsonObjects(r.out)
        #expect(objects.count == 4)
        #expect(Set(objects.compactMap { $0["outcome"] as? String }) == ["downloaded", "failed"])
        for i in 0..<3 {
            let o = objects.first { $0["path"] as? String == dir.file("f\(i)").string }
            #expect((o?["size"] as? NSNumber)?.intValue == bodies[i].count)
            #expect((o?["bytesTransferred"] as? NSNumber)?.intValue == bodies[i].count)
        }
        #expect(lines(log).count == 4)
        #expect(lines(log).filter { $0.hasPrefix("completed|") }.count == 3)
        await server.stop()
    }

    /// The client commands that change and clear downloads, list them as JSON, and wait for the end.
    @Test func clientCommandsChangeClearListAndWait() async throws {
        let server = try await TestServer.start()
        server.set("/w/0", Resource(body: Resource.bytes(count: 2_000_000), bytesPerSecond: 200_000))
        server.set("/w/1", Resource(body: Resource.bytes(count: 1000)))
        let root = TempDir(), state = TempDir()
        let daemon = try await ServeProcess.start(root: root, state: state)
        defer { daemon.stopIfRunning() }
        let s = ["--state", state.path.string]
        #expect(try await CLI.output(["add", server.url("/w/0"), "--limit-rate", "100K"] + s).status == 0)
        #expect(try await daemon.client.download(1).speedLimit == 102_400)
        #expect(try await CLI.output(["add", server.url("/w/1"), "-o", "one"] + s).status == 0)
        let set = try await CLI.output(["set", "1", "--priority", "4", "--limit-rate", "none"] + s)
        #expect(set.status == 0)
        let one = try await daemon.client.download(1)
        #expect(one.priority == 4 && one.speedLimit == nil)
        #expect(try await CLI.output(["set", "1"] + s).status == 2)
        #expect(try await CLI.output(["set", "1", "--limit-rate", "fast"] + s).status == 2)
        // ls --json --url: the API's objects for that URL only.
        let listed = try await CLI.output(["ls", "--json", "--url", server.url("/w/1")] + s)
        let array = try #require(try JSONSerialization.jsonObject(with: Data(listed.text.utf8)) as? [[String: Any]])
        #expect(array.map { ($0["id"] as? NSNumber)?.intValue } == [2])
        server.update("/w/0") { $0.bytesPerSecond = nil }
        _ = try await CLI.output(["pause", "1"] + s)
        _ = try await CLI.output(["resume", "1"] + s)
        // watch --until-done: returns once nothing waits or runs; 0 when nothing failed.
        #expect(try await CLI.output(["watch", "--until-done"] + s).status == 0)
        #expect(try await daemon.client.list(state: "completed").count == 2)
        let cleared = try await CLI.output(["rm", "--completed"] + s)
        #expect(cleared.status == 0 && cleared.text.contains("removed 2 completed"))
        #expect(try await daemon.client.list().isEmpty)
        #expect(root.read("one") != nil, "the files stay without --delete-file")
        // A failure gives watch --until-done the failure's exit code.
        #expect(try await CLI.output(["add", server.url("/missing")] + s).status == 0)
        #expect(try await CLI.output(["watch", "--until-done"] + s).status == 4)
        #expect(try await CLI.output(["rm", "--failed"] + s).status == 0)
        _ = await daemon.signal(SIGTERM)
        await server.stop()
    }
}
