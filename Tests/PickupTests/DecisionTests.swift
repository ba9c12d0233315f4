import Testing

@testable import Pickup

@Suite struct ResponseDecisionTests {
    let v1 = Validators(etag: "\"v1\"", lastModified: nil, date: nil)
    func head(_ status: Int, _ headers: [(String, String)]) -> ResponseHead {
        ResponseHead(status: status, headers: headers.map { (name: $0.0, value: $0.1) })
    }
    func resume(at offset: Int64 = 100) -> RequestContext {
        RequestContext(offset: offset, validators: v1, totalLength: 1000)
    }

    @Test func exactPartialIsAppended() {
        let d = ResponseDecision.decide(
            head(206, [("Content-Range", "bytes 100-999/1000"), ("ETag", "\"v1\""), ("Content-Length", "900")]),
            context: resume(), now: 0)
        #expect(d == .append(at: 100, end: 1000, total: 1000, validators: v1))
    }

    @Test func shiftedRangeIsNeverCombined() {
        let d = ResponseDecision.decide(head(206, [("Content-Range", "bytes 101-999/1000")]), context: resume(), now: 0)
        guard case .startOver = d else { Issue.record("expected startOver, got \(d)"); return }
        let fresh = ResponseDecision.decide(head(206, [("Content-Range", "bytes 5-999/1000")]),
                                            context: RequestContext(offset: 0, validators: nil, totalLength: nil), now: 0)
        guard case .fail = fresh else { Issue.record("expected fail, got \(fresh)"); return }
    }

    @Test func changedLengthOrValidatorStartsOver() {
        for h in [
            head(206, [("Content-Range", "bytes 100-1099/1100")]),
            head(206, [("Content-Range", "bytes 100-999/1000"), ("ETag", "\"v2\"")]),
            head(206, [("Content-Range", "bytes 100-999/1000"), ("Content-Length", "10")]),
            head(206, [("Content-Range", "bytes 100-999/1000, 0-5/1000")]),
            head(206, [("Content-Type", "multipart/byteranges; boundary=x")]),
        ] {
            guard case .startOver = ResponseDecision.decide(h, context: resume(), now: 0) else {
                Issue.record("expected startOver for \(h)")
                continue
            }
        }
    }

    @Test func fullResponseReplaces() {
        let d = ResponseDecision.decide(head(200, [("Content-Length", "1000"), ("ETag", "\"v2\"")]), context: resume(), now: 0)
        #expect(d == .replace(total: 1000, validators: Validators(etag: "\"v2\"", lastModified: nil, date: nil)))
    }

    @Test func unsatisfiableRange() {
        let complete = RequestContext(offset: 1000, validators: v1, totalLength: 1000)
        #expect(ResponseDecision.decide(head(416, [("Content-Range", "bytes */1000"), ("ETag", "\"v1\"")]), context: complete, now: 0) == .alreadyComplete)
        // Without a validator to confirm, or with another length, the held bytes are not trusted.
        for h in [head(416, [("Content-Range", "bytes */1000")]), head(416, [("Content-Range", "bytes */900"), ("ETag", "\"v1\"")]),
                  head(416, [("Content-Range", "bytes */1000"), ("ETag", "\"v2\"")])] {
            guard case .startOver = ResponseDecision.decide(h, context: complete, now: 0) else {
                Issue.record("expected startOver for \(h)")
                continue
            }
        }
    }

    @Test func transientAndPermanentStatuses() {
        #expect(ResponseDecision.decide(head(503, [("Retry-After", "7")]), context: resume(), now: 0) == .retry(after: 7, reason: "server answered 503"))
        #expect(ResponseDecision.decide(head(429, []), context: resume(), now: 0) == .retry(after: nil, reason: "server answered 429"))
        #expect(ResponseDecision.decide(head(408, []), context: resume(), now: 0) == .retry(after: nil, reason: "server answered 408"))
        #expect(ResponseDecision.decide(head(404, []), context: resume(), now: 0) == .fail(status: 404, reason: "server answered 404"))
        #expect(ResponseDecision.decide(head(302, [("Location", "/x")]), context: resume(), now: 0) == .redirect("/x"))
        guard case .fail = ResponseDecision.decide(head(302, []), context: resume(), now: 0) else {
            Issue.record("redirect without Location must fail")
            return
        }
    }

    @Test func notModifiedOnlyForConditionalRequests() {
        let held = Validators(etag: EntityTag("\"v1\""), lastModified: nil, lastModifiedIsStrong: false)
        let conditional = RequestContext(offset: 0, validators: nil, totalLength: nil, finished: (held, 100))
        #expect(ResponseDecision.decide(head(304, []), context: conditional, now: 0) == .notModified)
        guard case .fail = ResponseDecision.decide(head(304, []), context: resume(), now: 0) else {
            Issue.record("304 to an unconditional request must fail")
            return
        }
    }

    /// A server that ignores If-None-Match and sends the same file again (same strong validator,
    /// same length) has answered "unchanged"; another validator or length is a new version.
    @Test func theSameFileSentAgainToACheckIsUnchanged() {
        let held = Validators(etag: EntityTag("\"v1\""), lastModified: nil, lastModifiedIsStrong: false)
        let check = RequestContext(offset: 0, validators: nil, totalLength: nil, finished: (held, 100))
        #expect(ResponseDecision.decide(head(200, [("ETag", "\"v1\""), ("Content-Length", "100")]), context: check, now: 0) == .notModified)
        #expect(ResponseDecision.decide(head(206, [("ETag", "\"v1\""), ("Content-Range", "bytes 0-99/100")]), context: check, now: 0) == .notModified)
        #expect(ResponseDecision.decide(head(200, [("ETag", "\"v2\""), ("Content-Length", "100")]), context: check, now: 0) != .notModified)
        #expect(ResponseDecision.decide(head(200, [("ETag", "\"v1\""), ("Content-Length", "101")]), context: check, now: 0) != .notModified)
        #expect(ResponseDecision.decide(head(200, [("ETag", "W/\"v1\""), ("Content-Length", "100")]), context: check, now: 0) != .notModified)
        let fresh = RequestContext(offset: 0, validators: nil, totalLength: nil)
        #expect(ResponseDecision.decide(head(200, [("ETag", "\"v1\""), ("Content-Length", "100")]), context: fresh, now: 0) != .notModified)
    }
}

@Suite struct RetryPolicyTests {
    @Test func backoffGrowsAndGivesUp() {
        let p = RetryPolicy(maxAttemptsWithoutProgress: 3, baseDelay: 1, maxDelay: 3)
        #expect(p.delay(failuresInRow: 1, retryAfter: nil, jitter: 1) == 1)
        #expect(p.delay(failuresInRow: 2, retryAfter: nil, jitter: 1) == 2)
        #expect(p.delay(failuresInRow: 3, retryAfter: nil, jitter: 1) == 3)  // capped
        #expect(p.delay(failuresInRow: 3, retryAfter: nil, jitter: 0) == 1.5)  // jitter never below half
        #expect(p.delay(failuresInRow: 4, retryAfter: nil, jitter: 1) == nil)
    }

    @Test func honoursRetryAfterWithinLimit() {
        let p = RetryPolicy(maxRetryAfter: 60)
        #expect(p.delay(failuresInRow: 1, retryAfter: 30, jitter: 0.5) == 30)
        #expect(p.delay(failuresInRow: 1, retryAfter: 61, jitter: 0.5) == nil)
    }
}

@Suite struct ControlFileTests {
    let record = ControlRecord(
        url: "https://example.com/a.iso", target: "/tmp/a.iso", validators: Validators(etag: "\"v1\"", lastModified: nil, date: nil),
        totalLength: 1000, segments: [SegmentRecord(start: 0, end: 1000, done: 400)])

    @Test func roundTrips() {
        #expect(ControlFile.decode(ControlFile.encode(record)) == record)
    }

    @Test func tornOrForeignFilesAreNotTrusted() {
        let bytes = ControlFile.encode(record)
        #expect(bytes.count % 4096 == 0)  // padded to whole blocks, so it can be rewritten in place on a full disk
        let payloadStart = bytes.firstIndex(of: UInt8(ascii: "\n"))! + 1
        #expect(ControlFile.decode(Array(bytes.prefix(payloadStart + 20))) == nil)  // torn inside the payload
        var padding = bytes
        padding[padding.count - 1] = UInt8(ascii: "x")
        #expect(ControlFile.decode(padding) == nil)  // anything but padding after the payload
        var flipped = bytes
        flipped[flipped.count - 5] ^= 0x01
        #expect(ControlFile.decode(flipped) == nil)  // corrupted payload
        #expect(ControlFile.decode(Array("pickup-control 2 ".utf8) + bytes.dropFirst(17)) == nil)  // other version
        #expect(ControlFile.decode(Array("{\"url\":\"x\"}".utf8)) == nil)  // foreign
        #expect(ControlFile.decode([]) == nil)
    }
}
