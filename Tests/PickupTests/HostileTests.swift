import Foundation
import NIOCore
@testable import PickupDaemon
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// A file outside the download directory that nothing may touch, and a check that nothing did.
struct Bystander {
    let dir = TempDir()
    let bytes: [UInt8] = Array("not yours to overwrite\n".utf8)
    var path: FilePath { dir.file("victim") }
    init() { dir.write("victim", bytes) }
    var untouched: Bool { dir.read("victim") == bytes && dir.entries == ["victim"] }
}

func symlink(_ at: FilePath, to target: FilePath) throws {
    try FileManager.default.createSymbolicLink(atPath: at.string, withDestinationPath: target.string)
}

func isSymlink(_ path: FilePath) -> Bool {
    (try? FileManager.default.attributesOfItem(atPath: path.string))?[.type] as? FileAttributeType == .typeSymbolicLink
}

/// Symlinks planted where Pickup writes: its helper files and its target. Nothing outside the
/// directory may change, and no target may end up a symlink.
@Suite struct SymlinkTests {
    @Test(arguments: ["part", "hashed-part", "ctl", "ctl.tmp"])
    func aSymlinkAtAHelperFileNeverRedirectsAWrite(helper: String) async throws {
        try await Fixture().run { f in
            let body = Resource.bytes(count: 2 << 20, seed: 3)  // over a MiB: the control file is written at the first response
            f.server.set("/x.bin", Resource(body: body))
            let victim = Bystander()
            let hashed = helper == "hashed-part"
            let request = DownloadRequest(url: f.server.url("/x.bin"),
                                          destination: hashed ? .directory(f.dir.path) : .file(f.dir.file("x.bin")))
            let (_, partial, control) = try DownloadFiles.paths(for: request)
            let planted = switch helper {
            case "part", "hashed-part": partial
            case "ctl": control
            default: control + ".tmp"
            }
            try symlink(f.dir.file(planted), to: victim.path)
            let result: Result<DownloadResult, PickupError>
            do throws(PickupError) { result = .success(try await f.downloader.download(request)) } catch { result = .failure(error) }
            #expect(victim.untouched)
            switch helper {
            case "part", "hashed-part":
                // The partial file itself is a symlink: refused, said so, and left for the user.
                guard case .failure(let e) = result else { Issue.record("a symlinked partial file was used"); return }
                #expect(e.description.contains("symbolic link"))
                #expect(e.category == .fileSystem, "exit 6, as the README says")
                #expect(f.dir.read("x.bin") == nil)
            default:
                // A symlinked control file or temp file is replaced by a file of our own.
                let r = try result.get()
                #expect(f.dir.read("x.bin") == body)
                #expect(!isSymlink(r.path))
                #expect(f.dir.entries == ["x.bin"])
            }
        }
    }

    @Test func aSymlinkAtTheTargetIsNeitherFollowedNorReplacedUnlessAsked() async throws {
        try await Fixture().run { f in
            f.server.set("/x.bin", Resource(body: Resource.bytes(count: 5000)))
            let victim = Bystander()
            try symlink(f.dir.file("x.bin"), to: victim.path)
            let r = try await f.get("/x.bin")
            #expect(r.path == f.dir.file("x (1).bin"))
            #expect(isSymlink(f.dir.file("x.bin")))
            let over = try await f.get("/x.bin", to: .file(f.dir.file("x.bin")), overwrite: true, restart: true)
            #expect(!isSymlink(over.path))
            #expect(f.dir.read("x.bin") == Resource.bytes(count: 5000))
            #expect(victim.untouched)
        }
    }

    /// A finished download moved to the partial file's name of another download is left alone.
    @Test func aFinishedFileAtAPartialFilesNameIsNotTruncated() async throws {
        try await Fixture().run { f in
            let body = Resource.bytes(count: 3000)
            f.server.set("/a.bin", Resource(body: body))
            f.server.set("/b.bin", Resource(body: Resource.bytes(count: 10, seed: 9)))
            _ = try await f.get("/a.bin")
            try FileManager.default.moveItem(atPath: f.dir.file("a.bin").string, toPath: f.dir.file("b.bin.pickup-part").string)
            await #expect(throws: PickupError.self) { try await f.get("/b.bin", to: .file(f.dir.file("b.bin"))) }
            #expect(f.dir.read("b.bin.pickup-part") == body)
        }
    }

    @Test func namesThatCollideWithHelperFilesOrDoNotFitAreRefused() async throws {
        try await Fixture().run { f in
            f.server.set("/x.bin", Resource(body: [1, 2, 3]))
            for name in ["a.pickup-part", "a.pickup-ctl", "a.pickup-ctl.tmp", String(repeating: "n", count: 241)] {
                await #expect(throws: PickupError.self, "\(name)") { try await f.get("/x.bin", to: .file(f.dir.file(name))) }
            }
            #expect(f.dir.entries.isEmpty)
            // A server cannot name a file like a helper either.
            f.server.set("/y", Resource(body: [4, 5], contentDisposition: "attachment; filename=\"z.pickup-part\""))
            let r = try await f.get("/y")
            #expect(r.path.lastComponent?.string == "z.pickup-part_")
        }
    }
}

/// What a hostile or broken server can send.
@Suite struct HostileServerTests {
    @Test func aRedirectToAnImpossiblePortFailsThatDownloadOnly() async throws {
        try await Fixture().run { f in
            var r = Resource(body: [])
            r.redirect = (302, "http://127.0.0.1:99999/x")
            f.server.set("/r", r)
            do throws(PickupError) {
                _ = try await f.get("/r")
                Issue.record("the redirect was followed")
            } catch {
                #expect(error.category == .server)
                #expect(error.description.contains("99999"))
            }
            await #expect(throws: PickupError.self) {
                _ = try await f.downloader.download(DownloadRequest(url: "http://127.0.0.1:99999/x", destination: .directory(f.dir.path)))
            }
        }
    }

    /// A server that ignores If-None-Match and sends the finished file again with the same strong
    /// validator: unchanged, no second copy, however often it is run.
    @Test func theSameFileSentAgainIsNotSavedTwice() async throws {
        try await Fixture().run { f in
            let body = Resource.bytes(count: 300_000)
            var r = Resource(body: body)
            r.ignoresConditionals = true
            f.server.set("/same.bin", r)
            _ = try await f.get("/same.bin")
            for _ in 0..<2 {
                let again = try await f.get("/same.bin")
                #expect(again.outcome == .unchanged)
            }
            #expect(f.dir.entries == ["same.bin"])
            #expect(f.server.requests("/same.bin").count == 3)
            // A changed file under the same name is still fetched.
            f.server.update("/same.bin") { $0.etag = "\"v2\""; $0.body = Resource.bytes(count: 300_000, seed: 2) }
            let changed = try await f.get("/same.bin")
            #expect(changed.outcome == .downloaded)
        }
    }

    @Test func anOversizedResponseHeadIsAProtocolErrorAtOnce() async throws {
        let padding = String(repeating: "x", count: 100_000)
        let raw = RawServer.self
        let server = try await raw.start(response: Array("HTTP/1.1 200 OK\r\nX-Pad: \(padding)\r\nContent-Length: 1\r\n\r\nA".utf8))
        defer { Task { await server.stop() } }
        let state = TempDir(), dir = TempDir()
        let d = testDownloader(state: state.path, stall: 10)
        defer { Task { await d.shutdown() } }
        do {
            _ = try await d.download(DownloadRequest(url: server.url("/big-head"), destination: .directory(dir.path)))
            Issue.record("an 100 KB head was accepted")
        } catch {
            #expect(error.category == .server, "\(error)")
        }
        #expect(server.requests == 1, "a protocol error is not retried")
    }

    /// A head sent a byte at a time keeps resetting the stall timer; the head's own deadline ends it.
    @Test func aHeadSentByteByByteHitsTheHeadDeadline() async throws {
        let head = Array("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX-Slow: \(String(repeating: "s", count: 400))\r\n\r\nA".utf8)
        let server = try await RawServer.start(response: head, chunk: 1, interval: .milliseconds(50))
        defer { Task { await server.stop() } }
        let state = TempDir(), dir = TempDir()
        var transport = testTransport(stall: 10)
        transport.headTimeout = 2
        let d = Downloader(options: testOptions(state: state.path), transport: transport)
        defer { Task { await d.shutdown() } }
        do {
            _ = try await d.download(DownloadRequest(url: server.url("/slow-head"), destination: .directory(dir.path)))
            Issue.record("the slow head was waited for")
        } catch {
            #expect(error.category == .server, "\(error)")
            #expect(error.description.contains("response head"), "\(error)")
        }
    }

    @Test func aBodyBeyondTheMaximumSizeIsStopped() async throws {
        let state = TempDir(), dir = TempDir()
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        var options = testOptions(state: state.path)
        options.maxFileSize = 100_000
        let d = Downloader(options: options, transport: testTransport())
        defer { Task { await d.shutdown() } }
        var endless = Resource(body: Resource.bytes(count: 1_000_000), acceptRanges: false, sendLength: false)
        endless.etag = nil
        server.set("/endless", endless)
        server.set("/announced", Resource(body: Resource.bytes(count: 1_000_000)))
        for path in ["/endless", "/announced"] {
            do {
                _ = try await d.download(DownloadRequest(url: server.url(path), destination: .file(dir.file("out"))))
                Issue.record("\(path) was downloaded past the maximum")
            } catch {
                #expect(error.description.contains("larger than the maximum"), "\(error)")
            }
            #expect((FS.size(dir.file("out.pickup-part")) ?? 0) <= 100_000)
            #expect(dir.read("out") == nil)
        }
    }

    @Test func aNameThatDoesNotResolveSaysSo() async throws {
        let state = TempDir(), dir = TempDir()
        let d = testDownloader(state: state.path)
        defer { Task { await d.shutdown() } }
        do {
            _ = try await d.download(DownloadRequest(url: "http://name-that-does-not-exist.invalid/x", destination: .directory(dir.path)))
            Issue.record("downloaded from nowhere")
        } catch {
            #expect(error.description.contains("cannot resolve name-that-does-not-exist.invalid"), "\(error)")
        }
    }

    @Test func credentialsInAURLAreNeverShown() async throws {
        try await Fixture().run { f in
            let url = f.server.url("/missing").replacingOccurrences(of: "http://", with: "http://me:hunter2@")
            do throws(PickupError) {
                _ = try await f.downloader.download(DownloadRequest(url: url, destination: .directory(f.dir.path)))
                Issue.record("a missing file was downloaded")
            } catch {
                #expect(!error.description.contains("hunter2"), "\(error)")
                #expect(error.description.contains("://***@") && !error.description.contains("me:"), "\(error)")
            }
        }
    }
}

/// The retry budget counts progress by the most bytes ever held, so that a server cannot keep a
/// download retrying for ever by sending new bytes that replace old ones.
@Suite struct RetryBudgetTests {
    @Test func wholeFilesCutShortAgainAndAgainExhaustTheRetries() async throws {
        try await Fixture(retries: 3).run { f in
            let body = Resource.bytes(count: 100_000, seed: 12)
            // No range support: every answer is a 200 with the whole file, cut after 1,000 bytes.
            var r = Resource(body: body, acceptRanges: false, faults: Array(repeating: .dropAfter(1000), count: 40))
            r.etag = "\"x\""
            f.server.set("/cut.bin", r)
            do throws(PickupError) {
                _ = try await f.get("/cut.bin")
                Issue.record("a server that never sends more than 1,000 bytes kept the download going to the end")
            } catch {
                #expect(error.category == .network, "\(error)")
            }
            // Three attempts without progress after the first: a handful of requests, not forty.
            #expect(f.server.requests("/cut.bin").count <= 6)
        }
    }
}

/// Speed limits: every wait ends when the download is cancelled, whatever the limit.
@Suite struct SpeedLimitTests {
    @Test func cancellingAtTheLowestLimitEndsTheDownloadAtOnce() async throws {
        try await Fixture().run { f in
            f.server.set("/slow.bin", Resource(body: Resource.bytes(count: 1 << 20)))
            let limiter = RateLimiter(bytesPerSecond: RateLimiter.minimum)
            let (progressed, signal) = AsyncStream<Void>.makeStream()
            let request = DownloadRequest(url: f.server.url("/slow.bin"), destination: .directory(f.dir.path), limiters: [limiter])
            let task = Task { [downloader = f.downloader] in
                try await downloader.download(request) { if case .progress(let p) = $0, p.bytesDone > 0 { signal.yield() } }
            }
            for await _ in progressed { break }
            // The first read put the limiter a minute or more in debt: the connection is paused now.
            task.cancel()
            // A guard against a hang, not a timing assertion: without cancellable pauses this waits
            // for the debt (over a minute).
            let ended = await withTaskGroup(of: Bool.self) { group in
                group.addTask { _ = await task.result; return true }
                group.addTask { try? await Task.sleep(nanoseconds: 30_000_000_000); return false }
                let first = await group.next() ?? false
                group.cancelAll()
                return first
            }
            #expect(ended, "the download went on after being cancelled")
            // 1 MiB at 1 KiB/s cannot have finished: the task must have failed, as interrupted.
            guard case .failure(let e) = await task.result else {
                Issue.record("the download finished although it was cancelled at the lowest limit")
                return
            }
            #expect((e as? PickupError)?.category == .interrupted)
        }
    }

    @Test func aLimitBelowOneKiBIsAUsageError() async throws {
        let state = TempDir()
        #expect(try await CLI.run(["get", "http://127.0.0.1:1/x", "--limit-rate", "500"], state: state.path) == 2)
        #expect(try await CLI.run(["get", "http://127.0.0.1:99999/x"], state: state.path) == 2)
        let m = try DownloadManager(configuration: .init(stateDirectory: state.path.appending("m")))
        await #expect(throws: PickupError.self) {
            _ = try await m.add("http://127.0.0.1:1/x", to: .directory(state.path), speedLimit: 100)
        }
        await m.shutdown()
    }
}

/// The daemon's root holds at every operation, not only when a download is added.
@Suite struct DaemonConfinementTests {
    @Test func hiddenTooLongOrHelperNamesAreRefusedAndLeaveNothing() async throws {
        try await DaemonFixture().run { f in
            let names = [".ssh/authorized_keys", "a/.config/x", ".x", "new/dir/x.pickup-part", "new/" + String(repeating: "n", count: 241)]
            for name in names {
                let r = try await f.api(.POST, "/downloads", body: #"{"url":"\#(f.server.url("/x"))","name":"\#(name)"}"#)
                #expect(r.status == 400, "\(name): \(r.body)")
            }
            #expect(f.root.entries.isEmpty, "a rejected request created \(f.root.entries)")
            #expect(try await f.api(.POST, "/downloads", body: #"{"url":"http://127.0.0.1:99999/x"}"#).status == 400)
        }
    }

    /// Headers given to the API are sent; listings and events show their names, never the values.
    @Test func headersGoThroughTheAPIAndOnlyTheirNamesComeBack() async throws {
        try await DaemonFixture().run { f in
            f.server.set("/h.bin", Resource(body: [1, 2, 3]))
            let added = try await f.client.add(APIAddRequest(url: f.server.url("/h.bin"), headers: ["Authorization": "Bearer zzz", "X-A": "1"]))
            try await f.waitUntil { $0[added.id]?.state == "completed" }
            #expect(f.server.requests("/h.bin").first?.headers["authorization"] == "Bearer zzz")
            #expect(f.server.requests("/h.bin").first?.headers["x-a"] == "1")
            let one = try await f.api(.GET, "/downloads/\(added.id)")
            let all = try await f.api(.GET, "/downloads")
            for body in [one.body, all.body, added.headers?.joined() ?? ""] { #expect(!body.contains("zzz")) }
            #expect(one.body.contains("\"Authorization\""))
            let bad = try await f.api(.POST, "/downloads", body: #"{"url":"\#(f.server.url("/x"))","headers":{"Range":"bytes=0-"}}"#)
            #expect(bad.status == 400)
        }
    }

    @Test func aDirectorySwappedForASymlinkAfterAddLeadsNowhere() async throws {
        try await DaemonFixture().run { f in
            f.server.set("/x.bin", Resource(body: Resource.bytes(count: 10_000)))
            let outside = TempDir()
            let added = try await f.client.add(APIAddRequest(url: f.server.url("/x.bin"), name: "sub/x.bin", paused: true))
            try symlink(f.root.file("sub"), to: outside.path)
            _ = try await f.client.resume(added.id)
            let seen = try await f.waitUntil { $0[added.id]?.state == "failed" || $0[added.id]?.state == "completed" }
            #expect(seen[added.id]?.state == "failed")
            #expect(outside.entries.isEmpty)
        }
    }

    @Test func deletingAFileNeverFollowsASymlinkPlantedSince() async throws {
        try await DaemonFixture().run { f in
            let body = Resource.bytes(count: 10_000)
            f.server.set("/y.bin", Resource(body: body))
            let added = try await f.client.add(APIAddRequest(url: f.server.url("/y.bin"), name: "sub2/y.bin"))
            try await f.waitUntil { $0[added.id]?.state == "completed" }
            let outside = TempDir()
            outside.write("y.bin", body)
            try FileManager.default.moveItem(atPath: f.root.file("sub2").string, toPath: f.root.file("moved").string)
            try symlink(f.root.file("sub2"), to: outside.path)
            let r = try await f.api(.DELETE, "/downloads/\(added.id)?deleteFile=true")
            #expect(r.status == 204)
            #expect(outside.read("y.bin") == body)
        }
    }
}

@Suite struct CompletionIndexTests {
    @Test func entriesWhoseFileIsGoneAreSwept() async throws {
        try await Fixture().run { f in
            for i in 0..<3 {
                f.server.set("/f\(i)", Resource(body: Resource.bytes(count: 100 + i)))
                _ = try await f.get("/f\(i)")
            }
            let store = CompletionStore(stateDirectory: f.state.path)
            #expect(store.sweep() == 3)
            try FileManager.default.removeItem(atPath: f.dir.file("f0").string)
            f.dir.write("f1", [1])  // replaced by another file
            #expect(store.sweep() == 1)
        }
    }

    /// An index written by 0.1 (16 files) is found after the upgrade: the first lookup of one of
    /// its keys splits its file into the 256-way ones; a dropped entry stays dropped; a lookup
    /// reads one key's lines from the end.
    @Test func aSixteenWayIndexIsFoundAfterTheUpgrade() async throws {
        try await Fixture().run { f in
            f.server.set("/old", Resource(body: Resource.bytes(count: 500)))
            _ = try await f.get("/old")
            let store = CompletionStore(stateDirectory: f.state.path)
            let completed = f.state.path.appending("completed")
            // Rewrite the index as 0.1 kept it: every line in index-X.log by the key's first digit,
            // with another key's lines and a dropped one around it.
            let files = try FileManager.default.contentsOfDirectory(atPath: completed.string).filter { $0.hasPrefix("index-") }
            var lines: [String] = []
            for name in files {
                lines += (try String(contentsOfFile: completed.appending(name).string, encoding: .utf8)).split(separator: "\n").map(String.init)
                try FileManager.default.removeItem(atPath: completed.appending(name).string)
            }
            let key = try #require(lines.first.map { String($0.prefix(32)) })
            let other = String(key.prefix(1)) + String(repeating: "0", count: 31)
            let legacy = completed.appending("index-\(key.prefix(1)).log")
            let text = ([other + " {}"] + lines + [other + " -"]).joined(separator: "\n") + "\n"
            try text.write(toFile: legacy.string, atomically: true, encoding: .utf8)
            let dir = try DirectoryHandle.open(f.dir.path, under: nil, create: false)
            #expect(store.lookup(url: f.server.url("/old"), in: dir, name: nil)?.1.length == 500)
            #expect(!FileManager.default.fileExists(atPath: legacy.string), "the 16-way file was split")
            #expect(FileManager.default.fileExists(atPath: completed.appending("index-\(key.prefix(2)).log").string))
            #expect(store.indexed(other) == nil, "a dropped entry stays dropped")
            // A rerun finds the file without fetching it again.
            let before = f.server.requests("/old").count
            let again = try await f.get("/old")
            #expect(again.outcome == .unchanged)
            #expect(f.server.requests("/old").count == before + 1, "one conditional request")
        }
    }

    @Test func theLatestLineOfAKeyWins() {
        let a = String(repeating: "a", count: 32), b = String(repeating: "b", count: 32)
        let data = Array("\(a) 1\n\(b) 2\n\(a) 3\n\(b) -\nshort\n".utf8)
        #expect(CompletionStore.latest(a, in: data).map { String(decoding: $0, as: UTF8.self) } == "3")
        #expect(CompletionStore.latest(b, in: data) == nil)
        #expect(CompletionStore.latest(String(repeating: "c", count: 32), in: data) == nil)
        #expect(CompletionStore.latest(a, in: []) == nil)
    }
}
