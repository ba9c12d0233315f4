import Foundation
import PickupDaemon
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// A real `pickup serve` process on a free loopback port.
struct ServeProcess {
    let process: Child
    let client: DaemonClient

    /// Starts `pickup serve` and waits until it answers on the address it wrote.
    static func start(root: TempDir, state: TempDir, _ extra: [String] = []) async throws -> ServeProcess {
        let files = DaemonFiles(directory: state.path)
        let stale = files.readAddress()
        let p = try await CLI.start(["serve", "--listen", "127.0.0.1:0", "-d", root.path.string, "--state", state.path.string,
                               "-x", "1", "--stall-timeout", "1"] + extra, state: state.path)
        var answered: DaemonClient?
        _ = await eventually(every: 0.02) {
            guard p.isRunning else { return true }
            if let url = files.readAddress(), url != stale, let token = files.readToken() {
                let client = DaemonClient(baseURL: url, token: token)
                if (try? await client.settings()) != nil { answered = client }
            }
            return answered != nil
        }
        if let answered { return ServeProcess(process: p, client: answered) }
        await p.stop()
        throw CocoaError(.fileReadUnknown, userInfo: [NSLocalizedDescriptionKey: "pickup serve did not start"])
    }

    /// Polls the daemon until `condition` holds for its list of downloads.
    @discardableResult
    func waitUntil(_ condition: ([APIDownload]) -> Bool) async throws -> [APIDownload] {
        var last: [APIDownload] = []
        if try await eventually(every: 0.02, {
            last = try await client.list()
            return condition(last)
        }) { return last }
        Issue.record("gave up waiting: \(last.map { "\($0.id) \($0.state) \($0.bytesDone)" })")
        return last
    }

    /// Kills it if it still runs (for `defer`, so that a failed test leaves no daemon behind).
    func stopIfRunning() { process.kill() }

    /// Sends `sig` and waits for its end.
    func signal(_ sig: Int32) async -> Child.Status {
        process.signal(sig)
        return await process.wait()
    }
}

@Suite(.serialized, .timeLimit(.minutes(3))) struct DaemonProcessTests {
    /// SIGKILLs the daemon with three downloads in flight, starts it again: every download comes
    /// back in its state and finishes byte-exact, fetching again only what was not durable.
    @Test func sigkillMidTransferThenRestartFinishesEveryDownloadByteExact() async throws {
        #expect(FileManager.default.isExecutableFile(atPath: CLI.binary), "build the pickup binary first")
        let server = try await TestServer.start()
        let root = TempDir(), state = TempDir()
        let bodies = (0..<4).map { Resource.bytes(count: 3_000_000, seed: UInt64(40 + $0)) }
        // 150 KB/s: 20 s a file, so that all three are mid-transfer when the poll sees it, however
        // loaded the machine (at 500 KB/s they finished first in loaded full runs).
        for i in 0..<4 { server.set("/d/\(i).bin", Resource(body: bodies[i], bytesPerSecond: 150_000)) }

        let first = try await ServeProcess.start(root: root, state: state)
        defer { first.stopIfRunning() }
        for i in 0..<4 {
            _ = try await first.client.add(APIAddRequest(url: server.url("/d/\(i).bin"), name: "f\(i).bin", paused: i == 3 ? true : nil))
        }
        let control = { @Sendable (i: Int) in ControlFile.load(root.file("f\(i).bin.pickup-ctl"))?.durableBytes ?? 0 }
        let going = await eventually { (0..<3).allSatisfy { control($0) > 500_000 } }
        #expect(going, "the downloads did not get going")
        #expect(await first.signal(SIGKILL) == .signalled(SIGKILL))
        let held = (0..<3).map { heldAfterKill(root.file("f\($0).bin")).written }
        let before = (0..<4).map { server.requests("/d/\($0).bin").count }

        for i in 0..<4 { server.update("/d/\(i).bin") { $0.bytesPerSecond = nil } }
        let second = try await ServeProcess.start(root: root, state: state)
        defer { second.stopIfRunning() }
        let restored = try await second.client.list()
        #expect(restored.count == 4)
        #expect(restored.first { $0.name == "f3.bin" }?.state == "paused", "a paused download stays paused")
        try await second.waitUntil { list in list.filter { $0.state == "completed" }.count == 3 }
        for i in 0..<3 {
            #expect(root.read("f\(i).bin") == bodies[i], "file \(i)")
            let resumed = server.requests("/d/\(i).bin").dropFirst(before[i])
            #expect(resumed.first?.headers["if-range"] == "\"v1\"")
            #expect(resumed.reduce(0) { $0 + $1.bytesSent } == bodies[i].count - Int(held[i]), "file \(i) fetched again only what the killed daemon had not written")
        }
        #expect(server.requests("/d/3.bin").isEmpty)
        #expect(try await second.client.list(state: "paused").count == 1)
        #expect(await second.signal(SIGTERM).exited)
        await server.stop()
    }

    /// A download running each of the last two times the daemon died (SIGKILL here; a trap in the
    /// review's case) starts paused, saying why, and the rest of the queue runs: no crash loop.
    @Test func aDownloadRunningAtTwoDeathsStartsPausedAndTheQueueRuns() async throws {
        let server = try await TestServer.start()
        let root = TempDir(), state = TempDir()
        // Every answer stalls after 1,000 bytes (a fault a request): the download stays running until killed.
        server.set("/loop.bin", Resource(body: Resource.bytes(count: 1 << 20, seed: 8), faults: Array(repeating: .stallAfter(1000), count: 50)))
        let body = Resource.bytes(count: 300_000, seed: 9)
        server.set("/ok.bin", Resource(body: body))
        var asked = 0
        for round in 0..<2 {
            let daemon = try await ServeProcess.start(root: root, state: state, ["--stall-timeout", "600"])
            defer { daemon.stopIfRunning() }
            if round == 0 { _ = try await daemon.client.add(APIAddRequest(url: server.url("/loop.bin"), name: "loop.bin")) }
            let before = asked
            #expect(await eventually { server.requests("/loop.bin").count > before }, "round \(round): the download did not run")
            asked = server.requests("/loop.bin").count
            #expect(await daemon.signal(SIGKILL) == .signalled(SIGKILL))
        }
        let third = try await ServeProcess.start(root: root, state: state, ["--stall-timeout", "600"])
        defer { third.stopIfRunning() }
        let held = try #require(try await third.client.list().first { $0.name == "loop.bin" })
        #expect(held.state == "paused")
        #expect(held.error?.message.contains("twice") == true, "\(String(describing: held.error))")
        _ = try await third.client.add(APIAddRequest(url: server.url("/ok.bin"), name: "ok.bin"))
        try await third.waitUntil { $0.contains { $0.name == "ok.bin" && $0.state == "completed" } }
        #expect(root.read("ok.bin") == body)
        #expect(server.requests("/loop.bin").count == asked, "the held download ran again")
        // The user may try it again: resumed, it runs.
        _ = try await third.client.resume(held.id)
        #expect(await eventually { server.requests("/loop.bin").count > asked })
        #expect(await third.signal(SIGTERM).exited)
        await server.stop()
    }

    /// SIGTERM: every download is checkpointed, the process exits 0 and removes its address
    /// file; the next start resumes from the checkpoint.
    @Test func sigtermCheckpointsAndExitsCleanly() async throws {
        let server = try await TestServer.start()
        let root = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 4_000_000, seed: 7)
        server.set("/t.bin", Resource(body: body, bytesPerSecond: 500_000))
        let first = try await ServeProcess.start(root: root, state: state)
        defer { first.stopIfRunning() }
        let d = try await first.client.add(APIAddRequest(url: server.url("/t.bin")))
        try await first.waitUntil { $0.first?.bytesDone ?? 0 > 300_000 }
        #expect(await first.signal(SIGTERM) == .exited(0))
        #expect(DaemonFiles(directory: state.path).readAddress() == nil)
        // Whatever arrived before the signal is durable: the checkpoint at shutdown covers it.
        let held = try #require(Downloader.partialProgress(of: DownloadRequest(url: server.url("/t.bin"), destination: .directory(root.path)))).bytesHeld
        #expect(held > 300_000)

        server.update("/t.bin") { $0.bytesPerSecond = nil }
        let second = try await ServeProcess.start(root: root, state: state)
        defer { second.stopIfRunning() }
        try await second.waitUntil { $0.first?.state == "completed" }
        #expect(root.read("t.bin") == body)
        #expect(server.requests("/t.bin").last?.headers["range"]?.hasPrefix("bytes=\(held)-") == true)
        #expect(try await second.client.download(d.id).state == "completed")
        _ = await second.signal(SIGTERM)
        await server.stop()
    }

    /// `pickup add`, `ls`, `pause`, `resume`, `rm` against a running daemon, and their exit codes.
    @Test func clientCommandsDriveTheDaemon() async throws {
        let server = try await TestServer.start()
        let root = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 2_000_000, seed: 9)
        server.set("/c.bin", Resource(body: body, bytesPerSecond: 300_000))
        let daemon = try await ServeProcess.start(root: root, state: state)
        defer { daemon.stopIfRunning() }
        let s = ["--state", state.path.string]
        // `pickup watch` on a pipe: a line per change, from the snapshot on.
        let watchLog = state.file("watch.log")
        _ = FileManager.default.createFile(atPath: watchLog.string, contents: nil)
        let watch = try await CLI.start(["watch"] + s, state: state.path, output: .file(watchLog.string))
        defer { watch.kill() }
        let watched = { String(decoding: FileManager.default.contents(atPath: watchLog.string) ?? Data(), as: UTF8.self) }
        let added = try await CLI.output(["add", server.url("/c.bin"), "-o", "c.bin"] + s)
        #expect(added.status == 0)
        #expect(added.text.hasPrefix("added 1 c.bin"))
        #expect(try await CLI.run(["pause", "1"] + s, state: state.path) == 0)
        #expect(try await daemon.client.download(1).state == "paused")
        let listed = try await CLI.output(["ls", "paused"] + s)
        #expect(listed.status == 0)
        #expect(listed.text.contains("paused") && listed.text.contains("c.bin"))
        server.update("/c.bin") { $0.bytesPerSecond = nil }
        #expect(try await CLI.run(["resume", "--all"] + s, state: state.path) == 0)
        try await daemon.waitUntil { $0.first?.state == "completed" }
        #expect(root.read("c.bin") == body)
        #expect(await eventually { watched().contains("completed") }, "watch showed: \(watched())")
        #expect(watched().contains("paused"))
        #expect(try await CLI.run(["rm", "1", "--delete-file"] + s, state: state.path) == 0)
        #expect(await eventually { watched().contains("removed 1") })
        await watch.stop()
        #expect(root.read("c.bin") == nil)
        // Refused by the daemon: 2; no such download: 2; bad usage: 2.
        #expect(try await CLI.run(["add", "gopher://x/y"] + s, state: state.path) == 2)
        #expect(try await CLI.run(["pause", "42"] + s, state: state.path) == 2)
        #expect(try await CLI.run(["pause"] + s, state: state.path) == 2)
        _ = await daemon.signal(SIGTERM)
        // No daemon: 3.
        #expect(try await CLI.run(["ls"] + s, state: state.path) == 3)
        await server.stop()
    }
}

extension CLI {
    /// Runs `pickup` with a state directory of its own and returns its exit status and standard output.
    static func output(_ args: [String]) async throws -> (status: Int32, text: String) {
        let state = TempDir()
        let r = try await capture(args, state: state.path)
        withExtendedLifetime(state) {}
        return (r.status, r.out)
    }
}

/// A daemon with few descriptors, flooded with connections: it keeps what it can afford and closes
/// the rest at once, instead of failing every accept with EMFILE in a loop.
@Suite(.serialized, .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/prlimit"), "prlimit is not installed"))
struct DescriptorLimitTests {
    @Test func aFloodOfConnectionsPastTheDescriptorLimitIsClosedNotSpunOn() async throws {
        let root = TempDir(), state = TempDir()
        let files = DaemonFiles(directory: state.path)
        let p = try await CLI.start(["serve", "--listen", "127.0.0.1:0", "-d", root.path.string, "--state", state.path.string],
                              state: state.path, through: { ["/usr/bin/prlimit", "--nofile=128:128"] + $0 })
        defer { p.kill() }
        #expect(await eventually { files.readAddress() != nil || !p.isRunning })
        let port = try #require(files.readAddress().flatMap { URL(string: $0)?.port })
        // More connections than the process has descriptors.
        let flood = (0..<200).compactMap { _ in try? RawConnection(port: port) }
        #expect(flood.count == 200)
        // Those past its budget (half of 128) are closed, not left waiting in the backlog while
        // every accept fails.
        let closed = await eventually(seconds: 60) { flood.filter { $0.closedByPeer }.count >= 200 - 64 }
        #expect(closed, "\(flood.filter { $0.closedByPeer }.count) of 200 closed")
        withExtendedLifetime(flood) {}
    }
}
