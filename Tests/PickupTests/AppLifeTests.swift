import Foundation
import Observation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// What an app embedding the manager relies on: background and foreground, a UI model, waiting
/// for one download.
@Suite(.timeLimit(.minutes(3))) struct AppLifeTests {
    /// Going to the background stops every transfer after a checkpoint and starts nothing; coming
    /// back resumes them from where they were.
    @Test func suspendStopsEveryTransferAndStartResumesThem() async throws {
        try await ManagerFixture().run { f in
            // Each first answer stops a third of the way (paced): neither can finish before the suspension.
            let bodies = f.serveFiles(2, size: 2_000_000, rate: 300_000, stallAfter: 700_000)
            let m = try f.manager(limit: 2, stall: 600)
            var ids: [DownloadID] = []
            for i in bodies.indices { ids.append(try await m.add(f.server.url("/f/\(i).bin"), to: .directory(f.dir.path))) }
            let all = ids
            await m.waitUntil { v in all.allSatisfy { (v[$0]?.progress.bytesDone ?? 0) > 100_000 } }
            await m.suspend()
            let suspended = await m.downloads()
            #expect(!suspended.contains { $0.state == .running })
            #expect(suspended.allSatisfy { $0.state == .waiting })
            let requests = bodies.indices.map { f.server.requests("/f/\($0).bin").count }
            await m.start()
            await m.waitUntilAll(.completed)
            for (i, body) in bodies.enumerated() {
                #expect(f.dir.read("\(i).bin") == body)
                // The first request after coming back asks for the rest, with the validator.
                let again = f.server.requests("/f/\(i).bin")[requests[i]]
                #expect(again.headers["range"]?.hasPrefix("bytes=0-") == false, "\(again.headers)")
                #expect(again.headers["if-range"] == "\"v1\"")
            }
            await m.shutdown()
        }
    }

    /// Suspended, the manager holds no lock, as another process sees it (iOS ends a suspended app
    /// that holds a file lock in a shared container): not the state directory's, not SQLite's, not
    /// a partial file's. Calls meanwhile still work; a start takes everything back, or says it
    /// cannot while another holds the state directory.
    @Test func aSuspendedManagerHoldsNoLockAndStartTakesThemBack() async throws {
        try await ManagerFixture().run { f in
            let bodies = f.serveFiles(2, size: 2_000_000, rate: 300_000)
            let m = try f.manager(limit: 1)
            let first = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            await m.waitUntil { ($0[first]?.progress.bytesDone ?? 0) > 100_000 }
            await m.suspend()
            // (Under a heavy load it may have finished first: then there is no partial file to look at.)
            let unfinished = await m.downloads().first { $0.id == first }?.state != .completed
            // Added while suspended: kept (the database is opened for the call).
            let second = try await m.add(f.server.url("/f/1.bin"), to: .directory(f.dir.path))
            let script = """
                import fcntl, glob, sqlite3, sys
                state, downloads = sys.argv[1], sys.argv[2]
                for path in [state + "/manager.lock"] + glob.glob(downloads + "/.*.pickup-part") + glob.glob(downloads + "/*.pickup-part"):
                    with open(path, "rb+") as f:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        print("free", path.rsplit("/", 1)[-1])
                db = sqlite3.connect(state + "/manager.sqlite", timeout=0)
                db.execute("BEGIN EXCLUSIVE")
                print("free manager.sqlite", db.execute("SELECT count(*) FROM download").fetchone()[0])
                db.rollback()
                """
            let (status, out) = try await CLI.python(script, [f.state.path.string, f.dir.path.string])
            #expect(status == 0, "another process found a lock held: \(out)")
            #expect(out.contains("free manager.lock") && (out.contains("pickup-part") || !unfinished) && out.contains("free manager.sqlite 2"), "\(out)")
            // Another holder of the state directory: start says no, and nothing starts.
            let holder = open(f.state.file("manager.lock").string, O_RDWR | O_CLOEXEC)
            #expect(flock(holder, LOCK_EX | LOCK_NB) == 0)
            #expect(await m.start() == false)
            #expect(await m.downloads().allSatisfy { $0.state != .running })
            close(holder)
            #expect(await m.start())
            await m.waitUntilAll(.completed)
            for (i, body) in bodies.enumerated() {
                let same = f.dir.read("\(i).bin") == body
                #expect(same, "\(i).bin")
            }
            await m.shutdown()
            // Both kept across a restart.
            let again = try f.manager()
            #expect(Set(await again.downloads().map(\.id)) == [first, second])
            await again.shutdown()
        }
    }

    /// `open(configuration:)` restores a manager off the caller's thread, with init's errors.
    @MainActor @Test func openRestoresOffTheCallersThreadWithInitsErrors() async throws {
        try await ManagerFixture().run { f in
            let bodies = f.serveFiles(1, size: 100_000)
            let m = try await DownloadManager.open(configuration: f.configuration())
            let id = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            #expect(await m.outcome(of: id)?.state == .completed)
            await #expect(throws: PickupError.stateInUse(f.state.path.string)) { try await DownloadManager.open(configuration: f.configuration()) }
            await m.shutdown()
            let again = try await DownloadManager.open(configuration: f.configuration())
            #expect(await again.downloads().map(\.id) == [id])
            let same = f.dir.read("0.bin") == bodies[0]
            #expect(same)
            await again.shutdown()
        }
    }

    /// The app's container moves between launches (an update, a restore): with the container as a
    /// path base, every download goes on at the new place, byte-exact, with its true progress;
    /// nothing is created at the old place; a finished one is still known, and adding it again is
    /// the same download. Rows stored before the bases (absolute paths) are found too.
    @Test func theContainerMovesBetweenLaunchesAndEveryDownloadGoesOn() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let big = Resource.bytes(count: 3_000_000, seed: 71), small = Resource.bytes(count: 50_000, seed: 72)
        server.set("/big.bin", Resource(body: big, bytesPerSecond: 400_000))
        server.set("/small.bin", Resource(body: small))
        let top = TempDir()
        let old = top.file("container-1"), new = top.file("container-2")
        try FileManager.default.createDirectory(atPath: old.string, withIntermediateDirectories: true)
        func configuration(_ home: FilePath) -> DownloadManager.Configuration {
            let state = home.appending("Library/Application Support/Pickup")
            var c = DownloadManager.Configuration(stateDirectory: state)
            c.pathBases = PathBases(["home": home])
            c.progressInterval = 0.02
            c.engine = testOptions(state: state)
            c.transport = testTransport()
            return c
        }
        let m = try await DownloadManager.open(configuration: configuration(old))
        let done = try await m.add(server.url("/small.bin"), to: .directory(old.appending("Documents")))
        #expect(await m.outcome(of: done)?.state == .completed)
        let going = try await m.add(server.url("/big.bin"), to: .file(old.appending("Documents/big.bin")))
        await m.waitUntil { ($0[going]?.progress.bytesDone ?? 0) > 400_000 }
        await m.shutdown()
        // (Under a heavy load it may have finished first: then nothing is left to resume.)
        let unfinished = FileManager.default.fileExists(atPath: old.appending("Documents/big.bin.pickup-part").string)
        let rows = try ManagerStore(directory: old.appending("Library/Application Support/Pickup")).all()
        #expect(rows.allSatisfy { $0.destinationPath == "@home/Documents" || $0.destinationPath == "@home/Documents/big.bin" }, "\(rows.map(\.destinationPath))")
        // The container moves.
        #expect(rename(old.string, new.string) == 0)
        let requestsBefore = server.requests("/big.bin").count
        let again = try await DownloadManager.open(configuration: configuration(new))
        let restored = await again.downloads()
        #expect(restored.first { $0.id == going }?.destination == .file(new.appending("Documents/big.bin")))
        #expect((restored.first { $0.id == going }?.progress.bytesDone ?? 0) > 0, "its true progress, read at the new place")
        #expect(await again.outcome(of: going)?.state == .completed)
        let same = FileManager.default.contents(atPath: new.appending("Documents/big.bin").string).map(Array.init) == big
        #expect(same)
        let resumed = server.requests("/big.bin")[requestsBefore...]
        if unfinished {
            #expect(resumed.first?.headers["range"]?.hasPrefix("bytes=0-") == false, "resumed, not fetched again: \(resumed.map(\.headers))")
        }
        #expect(!FileManager.default.fileExists(atPath: old.string), "nothing created at the old place")
        #expect(await again.isDownloaded(server.url("/small.bin")))
        #expect(try await again.add(server.url("/small.bin"), to: .directory(new.appending("Documents"))) == done)
        await again.shutdown()
        #expect(!FileManager.default.fileExists(atPath: old.string))
    }

    @Test func pathBasesStoreRelativeAndNeverClimbOut() {
        let bases = PathBases(["home": "/var/mobile/Containers/Data/Application/A", "group": "/var/mobile/Containers/Shared/G", "bad name": "/x",
                               "rel": "relative"])
        #expect(bases.bases.keys.sorted() == ["group", "home"])
        #expect(bases.portable("/var/mobile/Containers/Data/Application/A/Documents/ep1.mp3") == "@home/Documents/ep1.mp3")
        #expect(bases.portable("/var/mobile/Containers/Shared/G") == "@group")
        #expect(bases.portable("/tmp/elsewhere") == "/tmp/elsewhere")
        let moved = PathBases(["home": "/var/mobile/Containers/Data/Application/B"])
        #expect(moved.resolve("@home/Documents/ep1.mp3") == "/var/mobile/Containers/Data/Application/B/Documents/ep1.mp3")
        #expect(moved.resolve("@group/x") == nil, "a base not named now is not guessed")
        #expect(moved.resolve("@home/../../etc/passwd") == nil, "never out of its base")
        #expect(moved.resolve("/abs/path") == "/abs/path")
    }

    @Test func outcomeWaitsForTheEndOfOneDownload() async throws {
        try await ManagerFixture().run { f in
            let bodies = f.serveFiles(1, size: 50_000)
            let m = try f.manager()
            let id = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
            let done = await m.outcome(of: id)
            #expect(done?.state == .completed)
            #expect(done?.path.flatMap { FileManager.default.contents(atPath: $0.string) }.map(Array.init) == bodies[0])
            let missing = try await m.add(f.server.url("/none"), to: .directory(f.dir.path))
            #expect(await m.outcome(of: missing)?.state == .failed)
            await m.shutdown()
        }
    }

    /// An app speaks in Foundation `URL`s: a file URL with a space for the directory and the state,
    /// a web URL to download, and `fileURL` back.
    @Test func urlsInAndOut() async throws {
        try await ManagerFixture().run { f in
            let bodies = f.serveFiles(1, size: 20_000)
            let folder = URL(fileURLWithPath: f.dir.path.string, isDirectory: true).appendingPathComponent("My Files")
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
            #expect(Destination.directory(at: folder) == .directory(f.dir.path.appending("My Files")))
            #expect(Destination.file(at: folder.appendingPathComponent("a b.bin")) == .file(f.dir.path.appending("My Files/a b.bin")))
            let web = try #require(URL(string: f.server.url("/f/0.bin")))
            let m = try DownloadManager(configuration: .init(stateDirectory: folder.appendingPathComponent(".state")))
            let id = try await m.add(web, to: .file(at: folder.appendingPathComponent("copy.bin")))
            let done = await m.outcome(of: id)
            #expect(done?.fileURL == folder.appendingPathComponent("copy.bin"))
            #expect(done?.fileURL.flatMap { try? Data(contentsOf: $0) }.map(Array.init) == bodies[0])
            await m.shutdown()
            let downloader = Downloader(options: testOptions(state: f.dir.path.appending("engine-state")))
            let result = try await downloader.download(DownloadRequest(url: web, destination: .directory(at: folder)))
            #expect(result.fileURL == folder.appendingPathComponent("0.bin") && (try? Data(contentsOf: result.fileURL)).map(Array.init) == bodies[0])
            await downloader.shutdown()
        }
    }

    @MainActor @Test func theObservableListFollowsTheManager() async throws {
        try await ManagerFixture().run { f in
            _ = f.serveFiles(3, size: 100_000)
            let m = try f.manager()
            let list = DownloadList(manager: m)
            for i in 0..<3 { _ = try await m.add(f.server.url("/f/\(i).bin"), to: .directory(f.dir.path)) }
            // (The totals come with the next tick after the last change: waited for too.)
            await until(list) { list.downloads.count == 3 && list.downloads.allSatisfy { $0.state == .completed } && list.totals?.fraction == 1 }
            #expect(list.downloads.map(\.progress.bytesDone) == [100_000, 100_000, 100_000])
            #expect(list.totals?.fraction == 1)
            let first = list.downloads[0].id
            try await m.remove(first)
            await until(list) { list[first] == nil }
            #expect(list.downloads.count == 2)
            await m.shutdown()
        }
    }
}

/// Waits (without a clock) until `condition` holds for `list`, re-checking at each change of it.
@MainActor func until(_ list: DownloadList, _ condition: @MainActor () -> Bool) async {
    while !condition() {
        await withCheckedContinuation { (resume: CheckedContinuation<Void, Never>) in
            withObservationTracking { _ = condition() } onChange: { resume.resume() }
        }
    }
}
