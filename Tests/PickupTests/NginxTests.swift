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
        let nginx = try await Nginx(root: site.path.string)
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
        let nginx = try await Nginx(root: site.path.string, limitRate: "1m")
        defer { nginx.stop() }
        let out = dir.file("big.bin")
        let slow = ["get", nginx.baseURL + "/slow/big.bin", "-o", out.string, "-q", "-x", "2"]
        _ = try await CLI.killMidway(slow, state: state.path, control: FilePath(out.string + ".pickup-ctl"), after: 1024 * 1024)
        #expect(try await CLI.run(["get", nginx.baseURL + "/big.bin", "-o", out.string, "-q"], state: state.path) == 0)
        #expect(dir.read("big.bin") == body)
        // The rerun resumed with a 206 (same file, same ETag on both locations).
        #expect(nginx.loggedStatuses.last == 206)
    }

    /// A batch of small files from a server that offers HTTP/2: every file a stream of one
    /// connection (one TLS handshake for all), byte-exact; a large file of the same batch is split
    /// into ranges over HTTP/1.1 connections of their own. Without HTTP/2 offered, the batch reuses
    /// its kept-alive connections: no more connections than files at a time.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"), "openssl missing"))
    func aBatchGoesOverOneHTTP2ConnectionAndLargeFilesOverRanges() async throws {
        var files: [String: [UInt8]] = [:]
        for i in 0..<24 { files["s\(i).bin"] = Resource.bytes(count: 40_000 + i, seed: UInt64(100 + i)) }
        files["big.bin"] = Resource.bytes(count: 12 * 1024 * 1024 + 1, seed: 99)
        for http2 in [true, false] {
            let tls = try await TLSNginx(serving: files, http2: http2)
            defer { tls.stop() }
            let state = TempDir(), dir = TempDir(), lists = TempDir()
            let small = files.keys.filter { $0.hasPrefix("s") }.sorted()
            lists.write("list", Array((small + ["big.bin"]).map { tls.nginx.baseURL + "/" + $0 + "\n" }.joined().utf8))
            let code = try await CLI.run(["get", "-i", lists.file("list").string, "-d", dir.path.string, "-j", "4", "-x", "4", "-q",
                             "--ca-certificate", tls.certificate], state: state.path)
            #expect(code == 0)
            for (name, bytes) in files { #expect(dir.read(name) == bytes, "\(name)") }
            let logged = tls.nginx.loggedConnections
            let streams = logged.filter { $0.protocol == "HTTP/2.0" }
            if http2 {
                #expect(streams.count >= small.count, "\(logged)")
                #expect(Set(streams.map(\.connection)).count == 1, "\(logged)")
                // The big file's ranges: HTTP/1.1, each connection its own.
                #expect(logged.contains { $0.protocol == "HTTP/1.1" }, "\(logged)")
            } else {
                #expect(streams.isEmpty)
                #expect(Set(logged.map(\.connection)).count <= 4 + 4, "\(logged)")
            }
        }
    }
}
