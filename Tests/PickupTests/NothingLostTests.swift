import Foundation
@testable import PickupDaemon
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// Issue 31, "hostile input": nothing is lost by one click or one flag. Removing an unfinished
/// download keeps its partial file unless asked (manager, API, `pickup rm`), and `-o PATH` (a
/// `.file` destination) never writes beside a file the user owns while saying it wrote there.
@Suite(.timeLimit(.minutes(3))) struct NothingLostTests {
    /// The helper files of `name` in `dir`.
    static func helpers(of name: String, in dir: TempDir) -> [String] {
        dir.entries.filter { $0.hasPrefix(name + ".pickup-") }
    }

    /// `remove` keeps an unfinished download's partial file (and its control file) unless
    /// `deletePartial`, whether it is removed while running or paused; what is kept is resumed by
    /// a later download of the same URL to the same path.
    @Test(arguments: [false, true], [false, true])
    func managerRemoveKeepsThePartialFileUnlessAsked(deletePartial: Bool, paused: Bool) async throws {
        try await ManagerFixture().run { f in
            // Its first answer stops a third of the way (paced): it cannot finish first.
            let body = f.serveFiles(1, size: 3_000_000, rate: 400_000, stallAfter: 1_000_000)[0]
            let m = try f.manager(stall: 600)
            let target = f.dir.file("0.bin")
            let id = try await m.add(f.server.url("/f/0.bin"), to: .file(target))
            await m.waitUntil { ($0[id]?.progress.bytesDone ?? 0) > 300_000 }
            if paused {
                try await m.pause(id)
                await m.waitUntil { $0[id]?.state == .paused }
            }
            try await m.remove(id, deletePartial: deletePartial)
            #expect(await m.download(id) == nil)
            await m.shutdown()  // waits for the transfer to end (and a deletion asked for after it)
            #expect(f.dir.read("0.bin") == nil)
            if deletePartial {
                #expect(Self.helpers(of: "0.bin", in: f.dir).isEmpty, "\(f.dir.entries)")
                return
            }
            #expect(Self.helpers(of: "0.bin", in: f.dir).contains("0.bin.pickup-part"), "\(f.dir.entries)")
            #expect(Self.helpers(of: "0.bin", in: f.dir).contains("0.bin.pickup-ctl"), "\(f.dir.entries)")
            // Findable: the same URL to the same path resumes it (as `pickup get URL -o 0.bin` would).
            f.server.update("/f/0.bin") { $0.bytesPerSecond = nil }
            let downloader = testDownloader(state: f.state.path)
            let r = try await downloader.download(DownloadRequest(url: f.server.url("/f/0.bin"), destination: .file(target)))
            await downloader.shutdown()
            #expect(r.resumedFrom > 0)
            #expect(f.dir.read("0.bin") == body)
            let resumed = f.server.requests("/f/0.bin").last?.headers
            #expect(resumed?["range"] != nil && resumed?["range"] != "bytes=0-", "\(String(describing: resumed))")
            #expect(f.dir.entries == ["0.bin"])
        }
    }

    /// `DELETE /downloads/{id}` keeps the partial file by default (adding the download again
    /// resumes it) and deletes it, with its helper files, with `deletePartial=true`.
    @Test func apiDeleteKeepsThePartialFileUnlessAsked() async throws {
        try await DaemonFixture { $0.transport = testTransport(stall: 600) }.run { f in
            // Each first answer stops a third of the way (and the daemon waits on it): none can
            // finish before it is paused. (A rate alone, 30 s a file, did not hold on loaded cores.)
            let body = Resource.bytes(count: 3_000_000, seed: 31)
            f.server.set("/keep.bin", Resource(body: body, faults: [.stallAfter(1_000_000)], bytesPerSecond: 100_000))
            f.server.set("/drop.bin", Resource(body: Resource.bytes(count: 3_000_000, seed: 32), faults: [.stallAfter(1_000_000)], bytesPerSecond: 100_000))
            let keep = try await f.client.add(APIAddRequest(url: f.server.url("/keep.bin"), name: "keep.bin"))
            let drop = try await f.client.add(APIAddRequest(url: f.server.url("/drop.bin"), name: "drop.bin"))
            try await f.waitUntil { ($0[keep.id]?.bytesDone ?? 0) > 300_000 && ($0[drop.id]?.bytesDone ?? 0) > 300_000 }
            _ = try await f.client.pause(keep.id)
            _ = try await f.client.pause(drop.id)
            try await f.waitUntil { $0[keep.id]?.state == "paused" && $0[drop.id]?.state == "paused" }

            #expect(try await f.api(.DELETE, "/downloads/\(keep.id)").status == 204)
            #expect(try await f.api(.DELETE, "/downloads/\(drop.id)?deletePartial=true").status == 204)
            #expect(try await f.api(.GET, "/downloads/\(keep.id)").status == 404)
            // A paused transfer may still be ending: its partial file goes once it has.
            let dropped = await eventually { Self.helpers(of: "drop.bin", in: f.root).isEmpty }
            #expect(dropped, "\(f.root.entries)")
            #expect(Self.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-part"), "\(f.root.entries)")
            #expect(Self.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-ctl"), "\(f.root.entries)")

            // Added again, it resumes from what was kept.
            f.server.update("/keep.bin") { $0.bytesPerSecond = nil }
            let again = try await f.client.add(APIAddRequest(url: f.server.url("/keep.bin"), name: "keep.bin"))
            try await f.waitUntil { $0[again.id]?.state == "completed" }
            #expect(f.root.read("keep.bin") == body)
            let resumed = f.server.requests("/keep.bin").last?.headers
            #expect(resumed?["range"] != nil && resumed?["range"] != "bytes=0-", "\(String(describing: resumed))")
            #expect(f.root.entries == ["keep.bin"])
        }
    }

    /// `pickup rm ID` keeps an unfinished download's partial file; `--delete-partial` deletes it
    /// with its helper files.
    @Test func pickupRmKeepsThePartialFileUnlessDeletePartial() async throws {
        try await DaemonFixture { $0.transport = testTransport(stall: 600) }.run { f in
            // Each first answer stops a third of the way: none can finish before it is paused.
            for name in ["keep.bin", "drop.bin"] {
                f.server.set("/" + name, Resource(body: Resource.bytes(count: 3_000_000, seed: 37), faults: [.stallAfter(1_000_000)], bytesPerSecond: 100_000))
            }
            let keep = try await f.client.add(APIAddRequest(url: f.server.url("/keep.bin"), name: "keep.bin", paused: false))
            let drop = try await f.client.add(APIAddRequest(url: f.server.url("/drop.bin"), name: "drop.bin", paused: false))
            try await f.waitUntil { ($0[keep.id]?.bytesDone ?? 0) > 300_000 && ($0[drop.id]?.bytesDone ?? 0) > 300_000 }
            _ = try await f.client.pause(keep.id)
            _ = try await f.client.pause(drop.id)
            try await f.waitUntil { $0[keep.id]?.state == "paused" && $0[drop.id]?.state == "paused" }
            let s = ["--state", f.state.path.string]
            let kept = try await CLI.capture(["rm", String(keep.id)] + s, state: f.state.path)
            #expect(kept.status == 0, "\(kept.err)")
            let dropped = try await CLI.capture(["rm", String(drop.id), "--delete-partial"] + s, state: f.state.path)
            #expect(dropped.status == 0, "\(dropped.err)")
            #expect(try await f.client.list().isEmpty)
            let gone = await eventually { Self.helpers(of: "drop.bin", in: f.root).isEmpty }
            #expect(gone, "\(f.root.entries)")
            #expect(Self.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-part"), "\(f.root.entries)")
            #expect(Self.helpers(of: "keep.bin", in: f.root).contains("keep.bin.pickup-ctl"), "\(f.root.entries)")
        }
    }

    /// A `.file` destination over a file that is not this URL's finished download fails with
    /// `targetExists` before any request, leaving it as it was and creating nothing; `overwrite`
    /// replaces it; then the file is Pickup's, and a rerun is the usual conditional check.
    @Test func aFileDestinationOverAForeignFileStopsUnlessOverwrite() async throws {
        try await Fixture().run { f in
            let body = Resource.bytes(count: 100_000, seed: 33)
            f.server.set("/a.bin", Resource(body: body))
            let mine = Array("my own notes\n".utf8)
            f.dir.write("notes.txt", mine)
            let target = Destination.file(f.dir.file("notes.txt"))
            do throws(PickupError) {
                _ = try await f.get("/a.bin", to: target)
                Issue.record("the download went ahead")
            } catch {
                guard case .targetExists(let path) = error else { throw error }
                #expect(path == f.dir.file("notes.txt").string)
                #expect(error.category == .fileSystem)
            }
            #expect(f.dir.read("notes.txt") == mine)
            #expect(f.dir.entries == ["notes.txt"])
            #expect(f.server.requests("/a.bin").isEmpty, "nothing is fetched")

            // A symlink there is refused the same way, and not followed.
            let victim = TempDir()
            victim.write("v", mine)
            try FileManager.default.createSymbolicLink(atPath: f.dir.file("link.bin").string, withDestinationPath: victim.file("v").string)
            await #expect(throws: PickupError.self) { try await f.get("/a.bin", to: .file(f.dir.file("link.bin"))) }
            #expect(victim.read("v") == mine)
            #expect(f.dir.entries == ["link.bin", "notes.txt"])

            let over = try await f.get("/a.bin", to: target, overwrite: true)
            #expect(over.outcome == .downloaded)
            #expect(f.dir.read("notes.txt") == body)
            // Pickup's own file now: the same request again asks the server and fetches nothing.
            let again = try await f.get("/a.bin", to: target)
            #expect(again.outcome == .unchanged)
            #expect(f.server.requests("/a.bin").last?.status == 304)
            // A changed version goes beside it, as before.
            let v2 = Resource.bytes(count: 1000, seed: 34)
            f.server.set("/a.bin", Resource(body: v2, etag: "\"v2\""))
            let changed = try await f.get("/a.bin", to: target)
            #expect(changed.path == f.dir.file("notes (1).txt"))
            #expect(f.dir.read("notes.txt") == body)
            #expect(f.dir.read("notes (1).txt") == v2)
        }
    }

    /// A directory destination keeps naming around a foreign file (`name (1).ext`).
    @Test func aDirectoryDestinationStillSavesBesideAForeignFile() async throws {
        try await Fixture().run { f in
            f.server.set("/b.bin", Resource(body: Resource.bytes(count: 1000, seed: 35)))
            f.dir.write("b.bin", [1, 2, 3])
            let r = try await f.get("/b.bin")
            #expect(r.path == f.dir.file("b (1).bin"))
            #expect(f.dir.read("b.bin") == [1, 2, 3])
        }
    }

    /// `pickup get URL -o EXISTING`: one line, exit 6 (as the README says), the file untouched,
    /// nothing else created, nothing fetched; `--overwrite` replaces it; the same command again
    /// after that is a conditional request that fetches nothing.
    @Test func getDashOOverAnExistingFileExitsSixUnlessOverwrite() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 200_000, seed: 36)
        server.set("/a.bin", Resource(body: body))
        let state = TempDir(), dir = TempDir()
        let mine = Array("my own notes\n".utf8)
        dir.write("a.bin", mine)
        let args = ["get", server.url("/a.bin"), "-o", dir.file("a.bin").string]
        let refused = try await CLI.capture(args, state: state.path)
        #expect(refused.status == 6, "\(refused.err)")
        let lines = refused.err.split(separator: "\n")
        #expect(lines.count == 1 && lines[0].contains("already exists") && lines[0].contains("--overwrite"), "\(refused.err)")
        #expect(dir.read("a.bin") == mine)
        #expect(dir.entries == ["a.bin"])
        #expect(server.requests("/a.bin").isEmpty, "nothing is fetched")

        let over = try await CLI.capture(args + ["--overwrite", "-q"], state: state.path)
        #expect(over.status == 0, "\(over.err)")
        #expect(dir.read("a.bin") == body)
        #expect(dir.entries == ["a.bin"])

        let again = try await CLI.capture(args, state: state.path)
        #expect(again.status == 0, "\(again.err)")
        #expect(server.requests("/a.bin").last?.status == 304)
        #expect(dir.read("a.bin") == body)
        #expect(dir.entries == ["a.bin"])
    }

    /// `-o` where a Metalink document's file was saved (its record is under the file's own URL,
    /// not the document's): the same command again still works; another URL that answers with a
    /// file stops at its first answer (exit 6), writing nothing, the file as it was.
    @Test func dashOWhereAMetalinkDocumentsFileIsFollowsTheFirstAnswer() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let a = Resource.bytes(count: 300_000, seed: 39)
        server.set("/m/a.bin", Resource(body: a, etag: "\"a\""))
        server.set("/get/image", MetalinkAnswerTests.documentResource(MetalinkTests.document(files: """
              <file name="image.bin"><url>\(server.url("/m/a.bin"))</url></file>
            """)))
        server.set("/other.bin", Resource(body: Resource.bytes(count: 300_000, seed: 40)))
        let state = TempDir(), dir = TempDir()
        let out = dir.file("image.bin").string
        let first = try await CLI.capture(["get", server.url("/get/image"), "-o", out, "-q"], state: state.path)
        #expect(first.status == 0, "\(first.err)")
        let again = try await CLI.capture(["get", server.url("/get/image"), "-o", out], state: state.path)
        #expect(again.status == 0, "\(again.err)")
        #expect(server.requests("/m/a.bin").count == 1, "the rerun fetches nothing: \(again.err)")
        let other = try await CLI.capture(["get", server.url("/other.bin"), "-o", out], state: state.path)
        #expect(other.status == 6, "\(other.err)")
        #expect(other.err.contains("already exists"), "\(other.err)")
        let same = dir.read("image.bin") == a
        #expect(same, "image.bin changed")
        #expect(dir.entries == ["image.bin"], "\(dir.entries)")
    }
}
