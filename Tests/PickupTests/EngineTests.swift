import Atomics
import Crypto
import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

@Suite struct EngineTests {
    let body = Resource.bytes(count: 3 * 1024 * 1024 + 17)

    @Test func downloadsByteExactAndLeavesNoHelperFiles() async throws {
        try await Fixture().run { f in
            f.server.set("/files/a.bin", Resource(body: body))
            let r = try await f.get("/files/a.bin")
            #expect(r.outcome == .downloaded)
            #expect(f.dir.read("a.bin") == body)
            #expect(f.dir.entries == ["a.bin"])
            let req = f.server.requests("/files/a.bin")
            #expect(req.count == 1)
            #expect(req[0].headers["range"] == "bytes=0-")
            #expect(req[0].headers["accept-encoding"] == "identity")
            #expect(req[0].headers["if-range"] == nil)
        }
    }

    @Test func droppedConnectionsResumeWithIfRangeAndRefetchNothing() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body, faults: [.dropAfter(700_000), .dropAfter(900_000), .dropAfter(500_000)]))
            _ = try await f.get("/a.bin")
            #expect(f.dir.read("a.bin") == body)
            let req = f.server.requests("/a.bin")
            #expect(req.count == 4)
            #expect(req[1].headers["range"] == "bytes=700000-\(body.count - 1)")
            #expect(req[1].headers["if-range"] == "\"v1\"")
            #expect(req[3].headers["range"] == "bytes=2100000-\(body.count - 1)")
            #expect(f.server.bytesSent("/a.bin") == body.count)
        }
    }

    @Test func stalledConnectionIsDroppedAndResumed() async throws {
        // Long enough that a loaded machine never mistakes a slow start for the stall under test
        // (the fault stalls the first request only).
        try await Fixture(stall: 1).run { f in
            f.server.set("/a.bin", Resource(body: body, faults: [.stallAfter(1_000_000)]))
            _ = try await f.get("/a.bin")
            #expect(f.dir.read("a.bin") == body)
            #expect(f.server.requests("/a.bin").last?.headers["range"] == "bytes=1000000-\(body.count - 1)")
            #expect(f.events.notices.contains { $0.contains("stalled") })
        }
    }

    @Test func linkThatDropsOftenStillFinishes() async throws {
        // More drops than the retry budget: each attempt makes progress, so the budget is not used up.
        try await Fixture(retries: 2).run { f in
            f.server.set("/a.bin", Resource(body: body, faults: Array(repeating: .dropAfter(300_000), count: 10)))
            _ = try await f.get("/a.bin")
            #expect(f.dir.read("a.bin") == body)
            #expect(f.server.requests("/a.bin").count == 11)
        }
    }

    @Test func ignoredRangeOnResumeRestartsCleanlyNeverAppends() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body, faults: [.dropAfter(1_000_000), .ignoreRange]))
            _ = try await f.get("/a.bin")
            #expect(f.dir.read("a.bin") == body)
            #expect(FS.size(f.dir.file("a.bin")) == Int64(body.count))
            #expect(f.events.notices.contains { $0.contains("whole file (200)") })
        }
    }

    @Test func shiftedOrMalformedContentRangeIsNeverCombined() async throws {
        for fault in [Fault.shiftContentRange(10), .contentRange("bytes 1000000-x/3145745"), .contentRange("bytes 1000000-2000000/99")] {
            try await Fixture().run { f in
                f.server.set("/a.bin", Resource(body: body, faults: [.dropAfter(1_000_000), fault]))
                _ = try await f.get("/a.bin")
                #expect(f.dir.read("a.bin") == body, "fault \(fault)")
                #expect(f.events.notices.contains { $0.contains("starting over") }, "fault \(fault)")
            }
        }
    }

    @Test func serviceUnavailableWithRetryAfterIsRetried() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body, faults: [.status(503, ["Retry-After": "0"]), .status(429, [:])]))
            _ = try await f.get("/a.bin")
            #expect(f.dir.read("a.bin") == body)
            #expect(f.server.requests("/a.bin").map(\.status) == [503, 429, 206])
        }
    }

    @Test func clientErrorsFailAtOnceWithTheServerCategory() async throws {
        try await Fixture().run { f in
            await #expect(throws: PickupError.self) { try await f.get("/missing.bin") }
            do throws(PickupError) {
                _ = try await f.get("/missing.bin")
            } catch {
                #expect(error.category == .server)
            }
            #expect(f.server.requests("/missing.bin").count == 2)
            #expect(f.dir.entries.isEmpty)
        }
    }

    @Test func retriesRunOutAsNetworkFailure() async throws {
        try await Fixture(retries: 2).run { f in
            f.server.set("/a.bin", Resource(body: body, faults: Array(repeating: .status(503, [:]), count: 5)))
            do throws(PickupError) {
                _ = try await f.get("/a.bin")
                Issue.record("expected failure")
            } catch {
                #expect(error.category == .network)
            }
            #expect(f.server.requests("/a.bin").count == 3)
        }
    }

    @Test func redirectsAreFollowedAndNameComesFromTheFinalURL() async throws {
        try await Fixture().run { f in
            f.server.set("/dl", .redirect(302, to: "/mirror/r2"))
            f.server.set("/mirror/r2", .redirect(307, to: f.server.url("/store/final-name.bin")))
            f.server.set("/store/final-name.bin", Resource(body: body))
            _ = try await f.get("/dl")
            #expect(f.dir.read("final-name.bin") == body)
        }
    }

    @Test func redirectLoopsAreBounded() async throws {
        try await Fixture().run { f in
            f.server.set("/loop", .redirect(302, to: "/loop"))
            do throws(PickupError) {
                _ = try await f.get("/loop")
                Issue.record("expected failure")
            } catch {
                #expect(error.description.contains("redirects"))
            }
        }
    }

    @Test func httpsToHttpRedirectIsRefused() throws {
        #expect(throws: PickupError.self) { try Attempt.resolveRedirect("http://example.com/b", from: "https://example.com/a", allowInsecure: false) }
        #expect(try Attempt.resolveRedirect("/b", from: "https://example.com/a", allowInsecure: false) == "https://example.com/b")
    }

    @Test func bodyWithoutLengthDownloadsInOneGo() async throws {
        try await Fixture().run { f in
            f.server.set("/stream", Resource(body: body, etag: nil, acceptRanges: false, sendLength: false))
            _ = try await f.get("/stream")
            #expect(f.dir.read("stream") == body)
        }
    }

    @Test func noValidatorNoLengthMeansStartingAgainAndSayingWhy() async throws {
        try await Fixture().run { f in
            // Chunked-like: no length, no validator; the first attempt fails mid-way with an error status after a drop.
            f.server.set("/s", Resource(body: body, etag: nil, acceptRanges: false, faults: [.dropAfter(500_000)]))
            _ = try await f.get("/s")
            #expect(f.dir.read("s") == body)
        }
    }

    @Test func contentDispositionNamesAreUsedSafely() async throws {
        try await Fixture().run { f in
            f.server.set("/x", Resource(body: body, contentDisposition: "attachment; filename*=UTF-8''na%C3%AFve%20r%C3%A9sum%C3%A9.pdf"))
            f.server.set("/evil", Resource(body: body, contentDisposition: "attachment; filename=\"../../escape.sh\""))
            _ = try await f.get("/x")
            _ = try await f.get("/evil")
            #expect(f.dir.read("naïve résumé.pdf") == body)
            #expect(f.dir.read("_.._escape.sh") == body)
            #expect(!FileManager.default.fileExists(atPath: f.dir.path.removingLastComponent().appending("escape.sh").string))
        }
    }

    @Test func serverDigestIsVerified() async throws {
        try await Fixture().run { f in
            let good = Data(SHA256.hash(data: body)).base64EncodedString()
            f.server.set("/ok", Resource(body: body, headers: ["Repr-Digest": "sha-256=:\(good):"]))
            _ = try await f.get("/ok")
            #expect(f.dir.read("ok") == body)

            let bad = Data(SHA256.hash(data: [1, 2, 3])).base64EncodedString()
            f.server.set("/bad", Resource(body: body, headers: ["Digest": "SHA-256=\(bad)"]))
            do throws(PickupError) {
                _ = try await f.get("/bad")
                Issue.record("expected verification failure")
            } catch {
                #expect(error.category == .verification)
            }
            #expect(f.dir.read("bad") == nil)
        }
    }

    @Test func checksumOptionIsVerifiedBeforeTheRename() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body))
            let wrong = ExpectedDigest(checksumArgument: "sha-256=" + String(repeating: "0", count: 64))!
            do throws(PickupError) {
                _ = try await f.get("/a.bin", checksum: wrong)
                Issue.record("expected verification failure")
            } catch {
                #expect(error.category == .verification)
            }
            #expect(f.dir.read("a.bin") == nil)
            let right = ExpectedDigest(source: "--checksum", algorithm: .sha256, bytes: Array(SHA256.hash(data: body)))
            _ = try await f.get("/a.bin", checksum: right)  // the kept bytes verify without a new transfer
            #expect(f.dir.read("a.bin") == body)
            #expect(f.server.requests("/a.bin").count == 1)
        }
    }

    @Test func foreignFileIsNeverOverwrittenUnlessAsked() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body))
            f.dir.write("a.bin", Array("mine".utf8))
            _ = try await f.get("/a.bin")
            #expect(f.dir.read("a.bin") == Array("mine".utf8))
            #expect(f.dir.read("a (1).bin") == body)
            #expect(f.events.notices.contains { $0.contains("already exists") })

            let other = TempDir()
            other.write("out.bin", Array("mine".utf8))
            _ = try await f.get("/a.bin", to: .file(other.file("out.bin")), overwrite: true)
            #expect(other.read("out.bin") == body)
        }
    }

    @Test func rerunAfterSuccessAsksTheServerAndFetchesNothing() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body))
            _ = try await f.get("/a.bin")
            let again = try await f.get("/a.bin")
            #expect(again.outcome == .unchanged)
            let req = f.server.requests("/a.bin")
            #expect(req.count == 2)
            #expect(req[1].headers["if-none-match"] == "\"v1\"")
            #expect(req[1].status == 304)
            #expect(f.dir.entries == ["a.bin"])
        }
    }

    @Test func rerunAfterServerChangeFetchesTheNewVersionUnderAFreeName() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body))
            _ = try await f.get("/a.bin")
            let v2 = Resource.bytes(count: 1000, seed: 2)
            f.server.set("/a.bin", Resource(body: v2, etag: "\"v2\""))
            let r = try await f.get("/a.bin")
            #expect(r.outcome == .downloaded)
            #expect(f.dir.read("a.bin") == body)
            #expect(f.dir.read("a (1).bin") == v2)
            // With --overwrite the new version replaces the old file.
            let v3 = Resource.bytes(count: 2000, seed: 3)
            f.server.set("/a.bin", Resource(body: v3, etag: "\"v3\""))
            _ = try await f.get("/a.bin", to: .file(f.dir.file("a.bin")), overwrite: true)
            #expect(f.dir.read("a.bin") == v3)
        }
    }

    @Test func resumesAcrossRunsAfterAFailure() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body, faults: [.dropAfter(1_234_567), .status(404, [:])]))
            await #expect(throws: PickupError.self) { try await f.get("/a.bin") }
            let ctl = ControlFile.load(f.dir.path.appending(f.dir.entries.first { $0.hasSuffix(".pickup-ctl") } ?? "none"))
            #expect(ctl?.durableBytes == 1_234_567)
            let r = try await f.get("/a.bin")
            #expect(r.resumedFrom == 1_234_567)
            #expect(f.dir.read("a.bin") == body)
            #expect(f.server.requests("/a.bin").last?.headers["range"] == "bytes=1234567-\(body.count - 1)")
            #expect(f.server.bytesSent("/a.bin") == body.count)
            #expect(f.dir.entries == ["a.bin"])
        }
    }

    @Test(arguments: [3 * 1024 * 1024 + 17, 5000])
    func fileChangedOnServerBetweenRunsIsNeverSpliced(size: Int) async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body, faults: [.dropAfter(1_000_000), .status(404, [:])]))
            await #expect(throws: PickupError.self) { try await f.get("/a.bin") }
            // Same size or another size: a new version with a new ETag.
            let v2 = Resource.bytes(count: size, seed: 9)
            f.server.set("/a.bin", Resource(body: v2, etag: "\"v2\""))
            let r = try await f.get("/a.bin")
            #expect(f.dir.read("a.bin") == v2)
            #expect(r.resumedFrom == 0)  // the held bytes were discarded, not resumed from
            #expect(f.server.requests("/a.bin").last?.headers["if-range"] == "\"v1\"")
        }
    }

    @Test func resumeWithLastModifiedAsValidator() async throws {
        try await Fixture().run { f in
            let lm = "Sun, 01 Nov 2026 10:00:00 GMT"
            f.server.set("/a.bin", Resource(body: body, etag: nil, lastModified: lm, faults: [.dropAfter(1_000_000), .status(404, [:])]))
            await #expect(throws: PickupError.self) { try await f.get("/a.bin") }
            _ = try await f.get("/a.bin")
            #expect(f.dir.read("a.bin") == body)
            #expect(f.server.requests("/a.bin").last?.headers["if-range"] == lm)
            #expect(f.server.bytesSent("/a.bin") == body.count)
        }
    }

    @Test func damagedControlFileIsIgnoredAndTheDownloadStartsOver() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body, faults: [.dropAfter(1_000_000), .status(404, [:])]))
            await #expect(throws: PickupError.self) { try await f.get("/a.bin") }
            let name = try #require(f.dir.entries.first { $0.hasSuffix(".pickup-ctl") }, "\(f.dir.entries)")
            var bytes = try #require(f.dir.read(name))
            bytes[bytes.count / 2] ^= 0xFF
            f.dir.write(name, bytes)
            _ = try await f.get("/a.bin")
            #expect(f.dir.read("a.bin") == body)
            #expect(f.events.notices.contains { $0.contains("damaged") })
            #expect(f.server.requests("/a.bin").last?.headers["range"] == "bytes=0-")
        }
    }

    @Test func restartDiscardsThePartialDownload() async throws {
        try await Fixture().run { f in
            f.server.set("/a.bin", Resource(body: body, faults: [.dropAfter(1_000_000), .status(404, [:])]))
            await #expect(throws: PickupError.self) { try await f.get("/a.bin") }
            _ = try await f.get("/a.bin", restart: true)
            #expect(f.server.requests("/a.bin").last?.headers["range"] == "bytes=0-")
            #expect(f.dir.read("a.bin") == body)
        }
    }

    @Test func cancellationCheckpointsAndTheNextRunResumes() async throws {
        try await Fixture(stall: 600).run { f in
            // The first answer stops a third of the way (paced, and waited on): the cancel comes
            // before the end however loaded the machine (a rate alone did not hold).
            f.server.set("/slow.bin", Resource(body: body, faults: [.stallAfter(1_000_000)], bytesPerSecond: 512 * 1024))
            let task = await f.startInBackground("/slow.bin", after: 200_000)
            task.cancel()
            let result = await task.result
            guard case .failure(let error as PickupError) = result, case .interrupted = error else {
                Issue.record("expected interrupted, got \(result)")
                return
            }
            let ctl = f.dir.entries.first { $0.hasSuffix(".pickup-ctl") }.flatMap { ControlFile.load(f.dir.file($0)) }
            let held = try #require(ctl?.durableBytes)
            #expect(held > 200_000)
            f.server.update("/slow.bin") { $0.bytesPerSecond = nil }
            _ = try await f.get("/slow.bin")
            #expect(f.dir.read("slow.bin") == body)
            #expect(f.server.requests("/slow.bin").last?.headers["range"] == "bytes=\(held)-\(body.count - 1)")
        }
    }

    @Test func twoRunsOfTheSameDownloadNeverShareThePartialFile() async throws {
        try await Fixture().run { f in
            f.server.set("/slow.bin", Resource(body: body, bytesPerSecond: 8 * 1024 * 1024))
            let first = await f.startInBackground("/slow.bin", after: 0)
            do throws(PickupError) {
                _ = try await f.get("/slow.bin")
                Issue.record("a second run must not drive the same partial file")
            } catch {
                #expect(error.category == .fileSystem)
                #expect(error.description.contains("another pickup process"))
            }
            _ = try await first.value
            #expect(f.dir.read("slow.bin") == body)
        }
    }

    @Test func downloadsAtOnceEachGetTheirOwnProgressAndNoneAfterTheyReturn() async throws {
        // One monitor ticks every download of a downloader: each must see its own progress, and
        // none may hear of it after download() returned (a tick then would be a stray callback).
        try await Fixture().run { f in
            let sizes = [400_000, 1_200_000, 2_400_000]
            for (i, n) in sizes.enumerated() {
                f.server.set("/p\(i).bin", Resource(body: Array(body.prefix(n)), bytesPerSecond: 4 * 1024 * 1024))
            }
            let results = try await withThrowingTaskGroup(of: (Int, [DownloadProgress], ManagedAtomic<Int>).self) { group in
                for i in sizes.indices {
                    group.addTask {
                        let log = EventLog()
                        let returned = ManagedAtomic(false)
                        let late = ManagedAtomic(0)
                        _ = try await f.downloader.download(
                            DownloadRequest(url: f.server.url("/p\(i).bin"), destination: .directory(f.dir.path))
                        ) { event in
                            if returned.load(ordering: .relaxed) { late.wrappingIncrement(ordering: .relaxed) }
                            log.record(event)
                        }
                        returned.store(true, ordering: .relaxed)
                        return (i, log.progress, late)
                    }
                }
                // The late events of the first ones are counted once the last one is done.
                var all: [(Int, [DownloadProgress], ManagedAtomic<Int>)] = []
                for try await r in group { all.append(r) }
                return all
            }
            for (i, progress, _) in results {
                #expect(!progress.isEmpty, "download \(i) got no progress")
                #expect(progress.allSatisfy { $0.totalBytes == nil || $0.totalBytes == Int64(sizes[i]) })
                #expect(f.dir.read("p\(i).bin") == Array(body.prefix(sizes[i])))
            }
            // Counted after every download ended and after one more download on the same downloader
            // (its progress means the shared monitor ticked again): a late event would have come by now.
            f.server.set("/after.bin", Resource(body: Array(body.prefix(400_000)), bytesPerSecond: 4 * 1024 * 1024))
            let after = EventLog()
            _ = try await f.downloader.download(DownloadRequest(url: f.server.url("/after.bin"), destination: .directory(f.dir.path))) {
                after.record($0)
            }
            #expect(!after.progress.isEmpty, "the monitor did not tick again")
            #expect(results.map { $0.2.load(ordering: .relaxed) }.reduce(0, +) == 0)
        }
    }

    @Test func progressReportsTotalsAndNeverGoesBackwards() async throws {
        try await Fixture().run { f in
            f.server.set("/slow.bin", Resource(body: body, bytesPerSecond: 16 * 1024 * 1024))
            _ = try await f.get("/slow.bin")
            let p = f.events.progress
            #expect(!p.isEmpty)
            // Before the first response the length is unknown; from then on it is always the true one.
            let known = p.drop { $0.totalBytes == nil }
            #expect(!known.isEmpty)
            #expect(known.allSatisfy { $0.totalBytes == Int64(body.count) })
            #expect(zip(p, p.dropFirst()).allSatisfy { $0.bytesDone <= $1.bytesDone })
        }
    }
}

struct NoTransport: Transport {
    func fetch<Sink: ResponseSink>(_ request: FetchRequest, into sink: Sink) async throws {
        throw TransportError.fatal("no transport")
    }
    func shutdown() async {}
}

/// `DownloadOptions.cursorFile` off: no mapped file beside the partial one, and a resume still
/// byte-exact from the checkpoints.
@Suite struct CursorFileOptionTests {
    @Test func withoutTheCursorFileNothingIsMappedAndResumesStillWork() async throws {
        let body = Resource.bytes(count: 3 * 1024 * 1024 + 5, seed: 61)
        for keep in [true, false] {
            let server = try await TestServer.start()
            defer { Task { await server.stop() } }
            server.set("/c.bin", Resource(body: body, faults: [.dropAfter(1_500_000), .status(503, [:])]))
            let state = TempDir(), dir = TempDir()
            var options = testOptions(state: state.path, retries: 1)
            options.cursorFile = keep
            let first = Downloader(options: options, transport: testTransport())
            let request = DownloadRequest(url: server.url("/c.bin"), destination: .directory(dir.path))
            await #expect(throws: PickupError.self) { try await first.download(request) }
            await first.shutdown()
            #expect(dir.entries.contains { $0.hasSuffix(".pickup-pos") } == keep, "cursor file \(keep): \(dir.entries)")
            #expect(dir.entries.contains { $0.hasSuffix(".pickup-ctl") }, "\(dir.entries)")
            let second = Downloader(options: options, transport: testTransport())
            let r = try await second.download(request)
            await second.shutdown()
            #expect(r.resumedFrom > 0, "resumed from the checkpoints")
            let same = dir.read("c.bin") == body
            #expect(same)
            #expect(dir.entries == ["c.bin"])
        }
    }
}
