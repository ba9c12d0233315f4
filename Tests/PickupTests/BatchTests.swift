import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

@Suite struct InputListTests {
    @Test func readsURLsCommentsAndNamesOnTheLineOrTheNext() throws {
        let list = try InputList(parsing: """
            # a comment

            http://h/a.bin
            https://h/b.bin out=bee.bin
            http://h/c.bin
              out=sea.bin
            http://h/a.bin\r
            """)
        #expect(list.entries.map(\.url) == ["http://h/a.bin", "https://h/b.bin", "http://h/c.bin"])
        #expect(list.entries.map(\.name) == [nil, "bee.bin", "sea.bin"])
        #expect(list.entries.map(\.line) == [3, 4, 5])
    }

    @Test(arguments: [
        ("gopher://h/a", "input line 1: not an http, https or ftp URL: gopher://h/a"),
        ("http://h/a out=../x", "input line 1: out=../x is not a plain file name"),
        ("http://h/a out=d/x", "input line 1: out=d/x is not a plain file name"),
        ("http://h/a dir=/tmp", "input line 1: unknown option dir (out, header, checksum, user-agent, referer)"),
        ("  out=x", "input line 1: an option line before any URL"),
    ])
    func refusesWhatWouldGoWrongNamingTheLine(text: String, message: String) {
        do {
            _ = try InputList(parsing: text)
            Issue.record("accepted: \(text)")
        } catch {
            #expect(error.description == message)
            #expect(error.category == .usage)
        }
    }
}

@Suite(.serialized) struct BatchCLITests {
    /// SIGKILLs `pickup get -i` mid-batch (some files finished, some partial), reruns it, and
    /// checks every file and that finished ones were not fetched again.
    @Test func sigkillMidBatchThenRerunCompletesEveryFileByteExact() async throws {
        #expect(FileManager.default.isExecutableFile(atPath: CLI.binary), "build the pickup binary first")
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir(), lists = TempDir()
        var bodies: [[UInt8]] = []
        for i in 0..<6 {
            let big = i >= 3
            let body = Resource.bytes(count: big ? 4_000_000 : 100_000, seed: UInt64(i + 10))
            server.set("/b/\(i).bin", Resource(body: body, bytesPerSecond: big ? 1_500_000 : nil))
            bodies.append(body)
        }
        lists.write("list.txt", Array((0..<6).map { "# file \($0)\n" + server.url("/b/\($0).bin") + " out=f\($0).bin" }
            .joined(separator: "\n").utf8))
        let args = ["get", "-i", lists.file("list.txt").string, "-d", dir.path.string, "-j", "3", "-x", "1", "-q"]

        // Killed from a poll on a thread of its own (the suite's load can keep Swift's pool busy
        // past the big files' end).
        let killed = try await CLI.startAndKill(args, state: state.path) {
            (3..<6).allSatisfy { (ControlFile.load(dir.file("f\($0).bin.pickup-ctl"))?.durableBytes ?? 0) > 1_000_000 }
        }
        #expect(killed, "the big files did not get going, or finished before the kill")
        for i in 0..<3 { #expect(dir.read("f\(i).bin") == bodies[i], "small file \(i) finished before the kill") }
        let before = (0..<6).map { server.requests("/b/\($0).bin").count }
        // Durable, or written as the cursor files say (the same boot).
        let held = (3..<6).map { heldAfterKill(dir.file("f\($0).bin")).written }

        for i in 3..<6 { server.update("/b/\(i).bin") { $0.bytesPerSecond = nil } }
        #expect(try await CLI.run(args, state: state.path) == 0)
        for i in 0..<6 { #expect(dir.read("f\(i).bin") == bodies[i], "file \(i)") }
        #expect(dir.entries == (0..<6).map { "f\($0).bin" })
        for i in 0..<3 { #expect(server.requests("/b/\(i).bin").count == before[i], "finished file \(i) fetched again") }
        for (k, i) in (3..<6).enumerated() {
            let resumed = server.requests("/b/\(i).bin").dropFirst(before[i])
            #expect(resumed.first?.headers["if-range"] == "\"v1\"")
            // The rerun fetches what the killed run had not written, and no more.
            #expect(resumed.reduce(0) { $0 + $1.bytesSent } == bodies[i].count - Int(held[k]))
        }
        // A third run has nothing to do and asks nothing.
        let total = (0..<6).map { server.requests("/b/\($0).bin").count }
        #expect(try await CLI.run(args, state: state.path) == 0)
        #expect((0..<6).map { server.requests("/b/\($0).bin").count } == total)
        await server.stop()
    }

    @Test func failuresAreSummarizedAndGiveTheirExitCode() async throws {
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir(), lists = TempDir()
        let body = Resource.bytes(count: 5000)
        server.set("/ok.bin", Resource(body: body))
        lists.write("list.txt", Array("\(server.url("/ok.bin"))\n\(server.url("/gone.bin"))\n".utf8))
        let args = ["get", "-i", lists.file("list.txt").string, "-d", dir.path.string, "-q"]
        #expect(try await CLI.run(args, state: state.path) == 4)
        #expect(dir.read("ok.bin") == body)
        // The failed one is retried on the next run; the finished one is not fetched again.
        server.set("/gone.bin", Resource(body: body))
        #expect(try await CLI.run(args, state: state.path) == 0)
        #expect(dir.read("gone.bin") == body)
        #expect(server.requests("/ok.bin").count == 1)
        lists.write("bad.txt", Array("http://x/a out=../../etc/passwd\n".utf8))
        #expect(try await CLI.run(["get", "-i", lists.file("bad.txt").string, "-d", dir.path.string], state: state.path) == 2)
        #expect(try await CLI.run(["get", "-i", lists.file("missing.txt").string], state: state.path) == 2)
        #expect(try await CLI.run(["get", "-i", lists.file("list.txt").string, "-o", "x"], state: state.path) == 2)
        await server.stop()
    }
}
