import Foundation
import PickupDaemon
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// Hooks against real `pickup` processes: bounded by their timeout whatever they start, stopped
/// with their whole process group, given no descriptor of Pickup's, and no obstacle to signals.
@Suite(.serialized, .timeLimit(.minutes(3))) struct HookProcessTests {
    /// A hook script that records its pid and its children's in `dir`, then does `body`.
    static func hook(in dir: TempDir, _ body: String) -> FilePath {
        let script = "#!/bin/sh\necho $$ > \(dir.file("hook.pid").string)\n\(body)\n"
        dir.write("hook.sh", Array(script.utf8))
        chmod(dir.file("hook.sh").string, 0o755)
        return dir.file("hook.sh")
    }

    static func pid(_ dir: TempDir, _ name: String) -> pid_t? {
        (try? String(contentsOfFile: dir.file(name).string, encoding: .utf8))
            .flatMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    /// Whether `pid` is still running (a zombie counts as ended).
    static func alive(_ pid: pid_t) -> Bool {
        guard kill(pid, 0) == 0 else { return false }
        let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
        return !stat.contains(") Z ")
    }

    @Test func aHookPastItsTimeoutIsStoppedWithEverythingItStarted() async throws {
        let server = try await TestServer.start()
        server.set("/h.bin", Resource(body: Resource.bytes(count: 1000)))
        let dir = TempDir(), state = TempDir(), scripts = TempDir()
        // A child in the background that outlives the hook's own process, and a wait.
        let hook = Self.hook(in: scripts, "sleep 300 >/dev/null 2>&1 &\necho $! > \(scripts.file("child.pid").string)\nsleep 300")
        let r = try await CLI.capture(["get", server.url("/h.bin"), "-d", dir.path.string, "-q", "--on-complete", hook.string,
                                 "--hook-timeout", "1"], state: state.path)
        #expect(r.status == 0)
        #expect(r.err.contains("ran out of time"), "\(r.err)")
        let child = try #require(Self.pid(scripts, "child.pid"))
        let own = try #require(Self.pid(scripts, "hook.pid"))
        defer { kill(child, SIGKILL); kill(own, SIGKILL) }
        // pickup has exited: the hook and the child it started went with its process group.
        #expect(await eventually(seconds: 10) { !Self.alive(child) && !Self.alive(own) }, "the hook's group outlived it")
        await server.stop()
    }

    @Test func aHookThatLeavesAChildBehindDoesNotHoldPickup() async throws {
        let server = try await TestServer.start()
        server.set("/b.bin", Resource(body: Resource.bytes(count: 1000)))
        let dir = TempDir(), state = TempDir(), scripts = TempDir()
        // Exits at once, leaving a background child that would hold any descriptor it inherited.
        let hook = Self.hook(in: scripts, "sleep 300 >/dev/null 2>&1 &\necho $! > \(scripts.file("child.pid").string)\nls -l /proc/self/fd/ > \(scripts.file("fds").string)\nexit 0")
        let r = try await CLI.capture(["get", server.url("/b.bin"), "-d", dir.path.string, "-q", "--on-complete", hook.string,
                                 "--hook-timeout", "120"], state: state.path)
        let child = try #require(Self.pid(scripts, "child.pid"))
        defer { kill(child, SIGKILL) }
        #expect(r.status == 0)
        // pickup returned while the child runs: it waited for the hook's process, not for the child.
        #expect(Self.alive(child), "pickup waited for the hook's background child")
        #expect(!r.err.contains("ran out of time"))
        // The hook saw standard input, output and error, and nothing else of Pickup's (the listing's
        // own descriptor aside).
        let fds = lines(scripts.file("fds")).filter { $0.contains("->") }
        #expect(fds.count <= 4, "the hook inherited descriptors: \(fds)")
        await server.stop()
    }

    @Test func aSignalToPickupStopsTheRunningHook() async throws {
        let server = try await TestServer.start()
        server.set("/s.bin", Resource(body: Resource.bytes(count: 1000)))
        let dir = TempDir(), state = TempDir(), scripts = TempDir()
        let hook = Self.hook(in: scripts, "sleep 300")
        let p = try await CLI.start(["get", server.url("/s.bin"), "-d", dir.path.string, "-q", "--on-complete", hook.string,
                               "--hook-timeout", "600"], state: state.path)
        defer { p.kill() }
        #expect(await eventually { Self.pid(scripts, "hook.pid") != nil })
        let own = try #require(Self.pid(scripts, "hook.pid"))
        defer { kill(own, SIGKILL) }
        p.signal(SIGTERM)
        #expect(await eventually(seconds: 30) { !p.isRunning }, "SIGTERM was not honoured while a hook ran")
        #expect(await p.wait() == .exited(143))
        #expect(await eventually(seconds: 10) { !Self.alive(own) }, "the hook outlived pickup")
        await server.stop()
    }
}

extension HookProcessTests {
    /// `pickup serve` stopped while a hook runs ends the hook's group before it exits itself:
    /// nothing of the daemon's is left running once its process is gone.
    @Test func serveStoppedWhileAHookRunsLeavesNoHookBehind() async throws {
        let server = try await TestServer.start()
        server.set("/d.bin", Resource(body: Resource.bytes(count: 1000)))
        let root = TempDir(), state = TempDir(), scripts = TempDir()
        // The shell ignores SIGTERM, and so does the child it waits on (an ignored signal is
        // inherited): only the SIGKILL to the group after the grace ends them.
        let hook = Self.hook(in: scripts, "trap '' TERM\nsleep 300 & echo $! > \(scripts.file("child.pid").string)\nwait\nwait")
        let serve = try await ServeProcess.start(root: root, state: state,
                                                 ["--on-complete", hook.string, "--hook-timeout", "600"])
        defer { serve.stopIfRunning() }
        _ = try await serve.client.add(APIAddRequest(url: server.url("/d.bin")))
        #expect(await eventually { Self.pid(scripts, "hook.pid") != nil && Self.pid(scripts, "child.pid") != nil })
        let own = try #require(Self.pid(scripts, "hook.pid")), child = try #require(Self.pid(scripts, "child.pid"))
        defer { kill(own, SIGKILL); kill(child, SIGKILL) }
        #expect(await serve.signal(SIGTERM).exited)
        // Checked at once: serve waited for the teardown before it exited.
        #expect(!Self.alive(own), "the hook outlived pickup serve")
        #expect(!Self.alive(child), "the hook's child outlived pickup serve")
        await server.stop()
    }
}

/// Secrets given on the command line are not left for `ps` to show.
@Suite(.serialized) struct ArgumentSecretTests {
    /// The forms of the same secrets a first scrubber missed: short options grouped after another
    /// (`-qu`, `-qH`) and a proxy written without a scheme (`--proxy=user:password@host:port`).
    static let spellings: [[String]] = [
        ["-u", "alice:TopSecret1", "-H", "X-Token: HeaderSecret3", "--cookie=session=CookieSecret4",
         "--proxy", "http://pu:ProxySecret5@127.0.0.1:1", "-q"],
        ["-qu", "alice:TopSecret1", "-qH", "X-Token: HeaderSecret3", "-qb", "session=CookieSecret4",
         "--proxy=pu:ProxySecret5@127.0.0.1:1"],
        ["-u", "alice:TopSecret1", "-qH", "X-Token: HeaderSecret3", "--cookie", "session=CookieSecret4",
         "--proxy", "pu:ProxySecret5@127.0.0.1:1"],
    ]

    @Test(arguments: 0..<spellings.count)
    func secretsAreOverwrittenInTheProcessArguments(spelling: Int) async throws {
        let server = try await TestServer.start()
        // The server sends 1,000 bytes and then nothing: the process waits (its stall timeout is
        // ten minutes) until the test has read its arguments and kills it, however loaded the machine.
        server.set("/p.bin", Resource(body: Resource.bytes(count: 1 << 20), faults: [.stallAfter(1000)]))
        let dir = TempDir(), state = TempDir()
        let url = server.url("/p.bin").replacingOccurrences(of: "http://", with: "http://urluser:UrlSecret2@")
        let p = try await CLI.start(["get", url, "-o", dir.file("p.bin").string] + Self.spellings[spelling]
                              + ["--noproxy", "127.0.0.1", "-x", "1", "--stall-timeout", "600"], state: state.path)
        defer { p.kill() }
        // Once the request is made, the arguments were parsed long before.
        #expect(await eventually { !server.requests("/p.bin").isEmpty || !p.isRunning })
        #expect(p.isRunning, "pickup ended before its arguments could be read")
        let raw = FileManager.default.contents(atPath: "/proc/\(p.pid)/cmdline") ?? Data()
        #expect(!raw.isEmpty, "no arguments to read")
        let cmdline = String(decoding: raw.map { $0 == 0 ? 32 : $0 }, as: UTF8.self)
        for secret in ["TopSecret1", "UrlSecret2", "HeaderSecret3", "CookieSecret4", "ProxySecret5", "alice", "urluser"] {
            #expect(!cmdline.contains(secret), "\(secret) is visible: \(cmdline)")
        }
        #expect(cmdline.contains("X-Token:") && cmdline.contains("127.0.0.1"), "the rest stays readable: \(cmdline)")
        // And the secrets were used: the request carried them.
        let request = try #require(server.requests("/p.bin").first)
        #expect(request.headers["x-token"] == "HeaderSecret3")
        #expect(request.headers["cookie"] == "session=CookieSecret4")
        await server.stop()
    }
}
