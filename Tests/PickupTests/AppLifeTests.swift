import Foundation
import Observation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// What an app embedding the manager relies on: background and foreground, a UI model, waiting
/// for one download.
@Suite(.timeLimit(.minutes(1))) struct AppLifeTests {
    /// Going to the background stops every transfer after a checkpoint and starts nothing; coming
    /// back resumes them from where they were.
    @Test func suspendStopsEveryTransferAndStartResumesThem() async throws {
        let f = try await ManagerFixture()
        let bodies = f.serveFiles(2, size: 2_000_000, rate: 300_000)
        let m = try f.manager(limit: 2)
        var ids: [DownloadID] = []
        for i in bodies.indices { ids.append(try await m.add(f.server.url("/f/\(i).bin"), to: .directory(f.dir.path))) }
        let all = ids
        await m.waitUntil { v in all.allSatisfy { (v[$0]?.progress.bytesDone ?? 0) > 100_000 } }
        await m.suspend()
        let suspended = await m.downloads()
        // (One may have completed just as it was stopped, under load: that is kept, not undone.)
        #expect(!suspended.contains { $0.state == .running })
        #expect(suspended.contains { $0.state == .waiting })
        let requests = bodies.indices.map { f.server.requests("/f/\($0).bin").count }
        await m.start()
        await m.waitUntilAll(.completed)
        for (i, body) in bodies.enumerated() {
            #expect(f.dir.read("\(i).bin") == body)
            guard suspended.first(where: { $0.url.hasSuffix("/f/\(i).bin") })?.state == .waiting else { continue }
            // The first request after coming back asks for the rest, with the validator.
            let again = f.server.requests("/f/\(i).bin")[requests[i]]
            #expect(again.headers["range"]?.hasPrefix("bytes=0-") == false, "\(again.headers)")
            #expect(again.headers["if-range"] == "\"v1\"")
        }
        await m.shutdown()
        await f.close()
    }

    /// Suspended, the manager holds no lock, as another process sees it (iOS ends a suspended app
    /// that holds a file lock in a shared container): not the state directory's, not SQLite's, not
    /// a partial file's. Calls meanwhile still work; a start takes everything back, or says it
    /// cannot while another holds the state directory.
    @Test func aSuspendedManagerHoldsNoLockAndStartTakesThemBack() async throws {
        let f = try await ManagerFixture()
        let bodies = f.serveFiles(2, size: 2_000_000, rate: 300_000)
        let m = try f.manager(limit: 1)
        let first = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
        await m.waitUntil { ($0[first]?.progress.bytesDone ?? 0) > 100_000 }
        await m.suspend()
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
        let (status, out) = try await CLI.offPool { () throws -> (Int32, String) in
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            p.arguments = ["-c", script, f.state.path.string, f.dir.path.string]
            let pipe = Pipe()
            p.standardOutput = pipe
            p.standardError = pipe
            try p.runWithSignalsUnblocked()
            CLI.bound(p)
            let data = pipe.fileHandleForReading.readDataToEndOfFile()
            p.waitUntilExit()
            return (p.terminationStatus, String(decoding: data, as: UTF8.self))
        }
        #expect(status == 0, "another process found a lock held: \(out)")
        #expect(out.contains("free manager.lock") && out.contains("pickup-part") && out.contains("free manager.sqlite 2"), "\(out)")
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
        await f.close()
    }

    /// `open(configuration:)` restores a manager off the caller's thread, with init's errors.
    @MainActor @Test func openRestoresOffTheCallersThreadWithInitsErrors() async throws {
        let f = try await ManagerFixture()
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
        await f.close()
    }

    @Test func outcomeWaitsForTheEndOfOneDownload() async throws {
        let f = try await ManagerFixture()
        let bodies = f.serveFiles(1, size: 50_000)
        let m = try f.manager()
        let id = try await m.add(f.server.url("/f/0.bin"), to: .directory(f.dir.path))
        let done = await m.outcome(of: id)
        #expect(done?.state == .completed)
        #expect(done?.path.flatMap { FileManager.default.contents(atPath: $0.string) }.map(Array.init) == bodies[0])
        let missing = try await m.add(f.server.url("/none"), to: .directory(f.dir.path))
        #expect(await m.outcome(of: missing)?.state == .failed)
        await m.shutdown()
        await f.close()
    }

    @MainActor @Test func theObservableListFollowsTheManager() async throws {
        let f = try await ManagerFixture()
        _ = f.serveFiles(3, size: 100_000)
        let m = try f.manager()
        let list = DownloadList(manager: m)
        for i in 0..<3 { _ = try await m.add(f.server.url("/f/\(i).bin"), to: .directory(f.dir.path)) }
        await until(list) { list.downloads.count == 3 && list.downloads.allSatisfy { $0.state == .completed } }
        #expect(list.downloads.map(\.progress.bytesDone) == [100_000, 100_000, 100_000])
        #expect(list.totals?.fraction == 1)
        let first = list.downloads[0].id
        try await m.remove(first)
        await until(list) { list[first] == nil }
        #expect(list.downloads.count == 2)
        await m.shutdown()
        await f.close()
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
