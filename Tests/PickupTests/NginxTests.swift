import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// Against real nginx (installed by .ci/run); skipped where nginx is not installed.
@Suite(.serialized, .enabled(if: Nginx.binary != nil, "nginx is not installed"))
struct NginxTests {
    @Test func downloadRerunAndChangedFile() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let v1 = Resource.bytes(count: 5 * 1024 * 1024 + 3, seed: 7)
        site.write("data.bin", v1)
        let nginx = try Nginx(root: site.path.string)
        defer { nginx.stop() }
        let downloader = testDownloader(state: state.path)
        let request = DownloadRequest(url: nginx.baseURL + "/data.bin", destination: .directory(dir.path))
        _ = try await downloader.download(request)
        #expect(dir.read("data.bin") == v1)
        let again = try await downloader.download(request)
        #expect(again.outcome == .unchanged)
        #expect(nginx.loggedStatuses == [206, 304])

        // nginx's ETag is mtime-size: a new version gets a new tag and lands under a free name.
        let v2 = Resource.bytes(count: 4096, seed: 8)
        site.write("data.bin", v2)
        _ = try await downloader.download(request)
        #expect(dir.read("data (1).bin") == v2)
        #expect(dir.read("data.bin") == v1)
        await downloader.shutdown()
    }

    @Test func killedCLIResumesAgainstNginx() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 8 * 1024 * 1024, seed: 11)
        site.write("big.bin", body)
        let nginx = try Nginx(root: site.path.string, limitRate: "1m")
        defer { nginx.stop() }
        let out = dir.file("big.bin")
        let slow = ["get", nginx.baseURL + "/slow/big.bin", "-o", out.string, "-q", "-x", "2"]
        _ = try CLI.killMidway(slow, state: state.path, control: FilePath(out.string + ".pickup-ctl"), after: 1024 * 1024)
        #expect(try CLI.run(["get", nginx.baseURL + "/big.bin", "-o", out.string, "-q"], state: state.path) == 0)
        #expect(dir.read("big.bin") == body)
        // The rerun resumed with a 206 (same file, same ETag on both locations).
        #expect(nginx.loggedStatuses.last == 206)
    }
}
