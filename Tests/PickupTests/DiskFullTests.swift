import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// A small tmpfs, mounted for the test (root only; skipped elsewhere).
final class SmallDisk: @unchecked Sendable {
    let path: FilePath
    init?(megabytes: Int) {
        guard getuid() == 0 else { return nil }
        let dir = TempDir().path.string + "-disk"
        try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        path = FilePath(dir)
        // mount(2) itself, not mount(8): nothing to wait for, in `init` and `deinit` alike.
        guard mount("tmpfs", dir, "tmpfs", 0, "size=\(megabytes)m") == 0 else { return nil }
    }
    func grow(megabytes: Int) -> Bool {
        mount("tmpfs", path.string, "tmpfs", UInt(MS_REMOUNT), "size=\(megabytes)m") == 0
    }
    deinit {
        umount2(path.string, Int32(MNT_DETACH))
        try? FileManager.default.removeItem(atPath: path.string)
    }
}

@Suite(.serialized, .enabled(if: getuid() == 0, "mounting a small tmpfs needs root"))
struct DiskFullTests {
    let body = Resource.bytes(count: 3 * 1024 * 1024, seed: 21)

    @Test func diskFullStopsClearlyKeepsTheBytesAndResumesOnceThereIsRoom() async throws {
        let disk = try #require(SmallDisk(megabytes: 2), "mounting a small tmpfs failed")
        try await Fixture().run { f in
            f.server.set("/big.bin", Resource(body: body, bytesPerSecond: 8 * 1024 * 1024))
            do throws(PickupError) {
                _ = try await f.get("/big.bin", to: .file(disk.path.appending("big.bin")))
                Issue.record("expected a disk-full error")
            } catch {
                #expect(error.category == .fileSystem)
                #expect(error.description.contains("disk full"))
            }
            let control = FilePath(disk.path.appending("big.bin").string + ".pickup-ctl")
            let held = ControlFile.load(control)?.durableBytes ?? 0
            #expect(held > 0, "bytes already durable are kept")
            #expect(disk.grow(megabytes: 8))
            _ = try await f.get("/big.bin", to: .file(disk.path.appending("big.bin")))
            #expect(FileManager.default.contents(atPath: disk.path.appending("big.bin").string).map(Array.init) == body)
            #expect(f.server.requests("/big.bin").last?.headers["range"]?.hasPrefix("bytes=\(held)-") == true)
        }
    }

    @Test func preallocationReportsAFullDiskBeforeDownloading() async throws {
        let disk = try #require(SmallDisk(megabytes: 2), "mounting a small tmpfs failed")
        var options = DownloadOptions()
        options.preallocate = true
        options.connections = 1
        let state = TempDir()
        options.stateDirectory = state.path
        let server = try await TestServer.start()
        server.set("/big.bin", Resource(body: body, bytesPerSecond: 1024 * 1024))
        let downloader = Downloader(options: options)
        do {
            _ = try await downloader.download(DownloadRequest(url: server.url("/big.bin"), destination: .file(disk.path.appending("big.bin"))))
            Issue.record("expected a disk-full error")
        } catch {
            #expect(error.category == .fileSystem)
        }
        // Reported at the first response, not at 99 %: the server had barely started sending.
        #expect(server.bytesSent("/big.bin") < body.count / 2)
        await downloader.shutdown()
        await server.stop()
    }
}
