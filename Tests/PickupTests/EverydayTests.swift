import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// Everyday use of the real binary: `-v` with secrets redacted, a config file of default options,
/// `pickup partials` and `pickup clean`, and a progress line that fits the terminal.
@Suite(.serialized, .timeLimit(.minutes(5))) struct EverydayTests {
    func pickup(_ args: [String], state: TempDir, environment: [String: String] = [:], input: [UInt8]? = nil) async throws
        -> (status: Int32, out: String, err: String)
    {
        let r = try await CLI.captureBytes(args, state: state.path, environment: environment, input: input)
        return (r.status, String(decoding: r.out, as: UTF8.self), r.err)
    }

    /// `-v`: each request's and response's head, numbered; credentials, cookies, a URL's user name
    /// and fields named like a key never shown; a server's control characters never reach the terminal.
    @Test func verboseShowsHeadsWithSecretsRedacted() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 200_000, seed: 41)
        server.set("/v.bin", Resource(body: body, headers: ["X-Evil": "a\u{202E}gpj.exe"]))
        let dir = TempDir()
        let url = server.url("/v.bin").replacingOccurrences(of: "http://", with: "http://alice-user:SEKRIT4@")
        let r = try await pickup(["get", url, "-o", dir.file("v.bin").string, "-v", "-H", "Authorization: Bearer SEKRIT1",
                                  "-H", "X-Api-Key: SEKRIT2", "-b", "sid=SEKRIT3", "-x", "1"], state: dir)
        #expect(r.status == 0, "\(r.err)")
        let same = dir.read("v.bin") == body
        #expect(same)
        #expect(r.err.contains("[1] > GET http://***@127.0.0.1:") && r.err.contains("/v.bin\n"), "\(r.err)")
        #expect(r.err.contains("[1] > Authorization: [redacted]") && r.err.contains("[1] > X-Api-Key: [redacted]")
                && r.err.contains("[1] > Cookie: [redacted]"), "\(r.err)")
        #expect(r.err.contains("[1] < 206") && r.err.lowercased().contains("[1] < content-range: bytes 0-199999/200000"), "\(r.err)")
        #expect(!r.err.contains("SEKRIT") && !r.err.contains("alice-user"), "\(r.err)")
        #expect(!r.err.contains("\u{202E}") && r.err.contains("a?gpj.exe"), "\(r.err)")
        // Without -v: no heads.
        let quiet = try await pickup(["get", server.url("/v.bin"), "-o", dir.file("w.bin").string], state: dir)
        #expect(quiet.status == 0 && !quiet.err.contains("> GET"), "\(quiet.err)")
    }

    /// The config file's options apply to `get`, the command line wins, a line that is not an
    /// option is named by its number, options that could lose bytes are refused there, and a file
    /// others may write is refused.
    @Test func theConfigFileGivesDefaultsAndTheCommandLineWins() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 100_000, seed: 42)
        server.set("/c.bin", Resource(body: body))
        let state = TempDir()
        let config = TempDir()
        let env = ["XDG_CONFIG_HOME": config.path.string]
        try FileManager.default.createDirectory(atPath: config.file("pickup").string, withIntermediateDirectories: true)
        let file = config.path.appending("pickup").appending("pickup.conf").string
        func write(_ text: String, mode: Int = 0o600) throws {
            _ = FileManager.default.createFile(atPath: file, contents: Data(text.utf8))
            try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: file)
        }
        // quiet and a header from the file: nothing said, the header sent.
        try write("# defaults\n\nquiet\n--header = \"X-From-Config: yes\"\nuser-agent=from-config\n")
        let a = try await pickup(["get", server.url("/c.bin"), "-o", state.file("a.bin").string], state: state, environment: env)
        #expect(a.status == 0 && a.err.isEmpty, "\(a.err)")
        let same = state.read("a.bin") == body
        #expect(same)
        let sent = server.requests("/c.bin").last
        #expect(sent?.headers["x-from-config"] == "yes" && sent?.headers["user-agent"] == "from-config", "\(String(describing: sent))")
        // The command line wins over the file (a later value replaces the file's).
        _ = try await pickup(["get", server.url("/c.bin"), "-o", state.file("b.bin").string, "-A", "from-cli"], state: state, environment: env)
        #expect(server.requests("/c.bin").last?.headers["user-agent"] == "from-cli")
        // --no-config: none of it.
        let none = try await pickup(["get", server.url("/c.bin"), "-o", state.file("c.bin").string, "--no-config"], state: state,
                                    environment: env)
        #expect(none.status == 0 && server.requests("/c.bin").last?.headers["x-from-config"] == nil, "\(none.err)")
        // A `dir` in the file gives way to -o on the command line (which excludes it), and ~/ is the home.
        try write("dir = ~/downloads\n")
        let o = try await pickup(["get", server.url("/c.bin"), "-o", state.file("o.bin").string], state: state,
                                 environment: env.merging(["HOME": state.path.string]) { $1 })
        #expect(o.status == 0 && state.read("o.bin") != nil, "\(o.err)")
        let d = try await pickup(["get", server.url("/c.bin")], state: state, environment: env.merging(["HOME": state.path.string]) { $1 })
        #expect(d.status == 0 && state.read("downloads/c.bin") != nil, "\(d.err)")
        // Wrong lines are named; so are options that would lose bytes at every run.
        try write("connections = 4\nfrobnicate = 3\n")
        let bad = try await pickup(["get", server.url("/c.bin"), "-o", state.file("d.bin").string], state: state, environment: env)
        #expect(bad.status == 2 && bad.err.contains("pickup.conf line 2") && bad.err.contains("frobnicate"), "\(bad.err)")
        try write("connections = 99\n")
        let range = try await pickup(["get", server.url("/c.bin"), "-o", state.file("d.bin").string], state: state, environment: env)
        #expect(range.status == 2 && range.err.contains("line 1") && range.err.contains("connections"), "\(range.err)")
        try write("restart\n")
        let restart = try await pickup(["get", server.url("/c.bin"), "-o", state.file("d.bin").string], state: state, environment: env)
        #expect(restart.status == 2 && restart.err.contains("--restart") && restart.err.contains("command line"), "\(restart.err)")
        // Writable by others: refused, and nothing downloaded.
        try write("quiet\n", mode: 0o666)
        let open = try await pickup(["get", server.url("/c.bin"), "-o", state.file("e.bin").string], state: state, environment: env)
        #expect(open.status == 2 && open.err.contains("may be written by others"), "\(open.err)")
        #expect(state.read("e.bin") == nil)
        // Other commands never read it.
        let help = try await pickup(["partials", state.path.string], state: state, environment: env)
        #expect(help.status == 0, "\(help.err)")
    }

    /// `pickup partials` lists what an interrupted download left (hidden helper files included);
    /// `pickup clean` says what it removes, asks for --yes off a terminal, removes only helper files,
    /// and keeps the finished files beside them.
    @Test func partialsListsAndCleanRemovesUnfinishedDownloads() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 2_000_000, seed: 43)
        server.set("/p.iso", Resource(body: body, faults: [.dropAfter(500_000)] + Array(repeating: .status(503, [:]), count: 20)))
        server.set("/done.bin", Resource(body: Resource.bytes(count: 1000, seed: 44)))
        let state = TempDir()
        let dir = TempDir()
        // An interrupted download into a directory (no retries: the partial file stays), and a finished one.
        let cut = try await pickup(["get", server.url("/p.iso"), "-d", dir.path.string, "--retries", "0", "-x", "1"], state: state)
        #expect(cut.status != 0, "\(cut.err)")
        let done = try await pickup(["get", server.url("/done.bin"), "-d", dir.path.string], state: state)
        #expect(done.status == 0, "\(done.err)")
        #expect(dir.entries.contains { $0.hasSuffix(".pickup-part") }, "\(dir.entries)")
        let list = try await pickup(["partials", dir.path.string], state: state)
        #expect(list.status == 0, "\(list.err)")
        #expect(list.out.contains(server.url("/p.iso")) && list.out.contains("1 unfinished download"), "\(list.out)")
        #expect(list.out.contains("/1.9 MiB"), "held of the whole length: \(list.out)")
        let json = try await pickup(["partials", dir.path.string, "--json"], state: state)
        let object = try JSONSerialization.jsonObject(with: Data(json.out.utf8)) as? [String: Any]
        #expect((object?["bytesHeld"] as? Int).map { $0 > 0 } == true && object?["totalBytes"] as? Int == body.count, "\(json.out)")
        // Off a terminal, clean asks for --yes and removes nothing without it.
        let ask = try await pickup(["clean", dir.path.string], state: state)
        #expect(ask.status == 2 && ask.err.contains("--yes"), "\(ask.err)")
        #expect(dir.entries.contains { $0.hasSuffix(".pickup-part") })
        let clean = try await pickup(["clean", dir.path.string, "--yes"], state: state)
        #expect(clean.status == 0 && clean.out.contains("removed 1 unfinished download"), "\(clean.out) \(clean.err)")
        #expect(dir.entries == ["done.bin"], "\(dir.entries)")
        let empty = try await pickup(["partials", dir.path.string], state: state)
        #expect(empty.out.contains("no unfinished downloads"), "\(empty.out)")
        // A directory that is not there: said, exit 6.
        let missing = try await pickup(["partials", dir.file("nope").string], state: state)
        #expect(missing.status == 6 && missing.err.contains("nope"), "\(missing.err)")
    }

    /// On a 40-column terminal every redraw of the progress line fits in 39 columns.
    @Test func theProgressLineFitsANarrowTerminal() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 1_000_000, seed: 45)
        var slow = Resource(body: body)
        slow.bytesPerSecond = 400_000
        server.set("/a-rather-long-file-name-for-a-narrow-terminal.iso", slow)
        let dir = TempDir(), state = TempDir()
        let args = ["get", server.url("/a-rather-long-file-name-for-a-narrow-terminal.iso"), "-d", dir.path.string, "-x", "1"]
        // On a terminal (`script`'s) of 40 columns.
        let p = try await CLI.start(args, state: state.path, output: .captured, through: { command in
            ["/usr/bin/script", "-q", "-e", "-c", "stty cols 40 rows 20; exec " + CLI.shellQuoted(command), "/dev/null"]
        })
        let outcome = await p.finish()
        let r = (outcome.status.code, outcome.text)
        #expect(r.0 == 0, "\(r.1)")
        let same = dir.read("a-rather-long-file-name-for-a-narrow-terminal.iso") == body
        #expect(same)
        let redraws = r.1.components(separatedBy: "\r\u{1B}[K").map { $0.split(separator: "\r\n").first.map(String.init) ?? "" }
            .filter { $0.contains("/s") && !$0.hasPrefix("saved") && !$0.hasPrefix("pickup:") }
        #expect(!redraws.isEmpty, "\(r.1.debugDescription)")
        for line in redraws { #expect(line.count <= 39, "\(line.count): \(line)") }
        // (Whether the name fits beside the numbers depends on them: ProgressTextTests checks it.)
    }
}

/// One version everywhere users read it: `pickup --version`, the CHANGELOG's newest release, and
/// the README's package line.
@Suite struct VersionTests {
    @Test func theVersionAgreesEverywhere() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let version = PickupVersion.string
        #expect(version.split(separator: ".").count == 3 && version.split(separator: ".").allSatisfy { Int($0) != nil }, "semantic: \(version)")
        let printed = try await CLI.captureBytes(["--version"], state: TempDir().path)
        #expect(String(decoding: printed.out, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) == version)
        let changelog = try String(contentsOf: root.appendingPathComponent("CHANGELOG.md"), encoding: .utf8)
        let releases = changelog.split(separator: "\n").filter { $0.hasPrefix("## [") && !$0.hasPrefix("## [Unreleased]") }
        #expect(releases.first?.hasPrefix("## [\(version)]") == true, "\(releases.first ?? "none")")
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        #expect(readme.contains("from: \"\(version)\""), "the README's package line")
    }
}
