import Foundation
import NIOConcurrencyHelpers

extension Downloader {
    /// Streams `request.url`'s bytes in order to `write` as they arrive (`pickup get -o -`): one
    /// connection, nothing on disk, so nothing resumes in a later run. Within the run a dropped
    /// connection is taken up where it broke when the server gives a strong validator
    /// (`If-Range`); otherwise, or when the server answers with anything but the rest of the same
    /// file, the stream fails: bytes already handed over cannot be taken back, and two versions
    /// are never spliced. Redirects, the user's header fields and cookies (secrets to the given
    /// URL's origin only), retries, `checksum` (checked at the end), the request's limiters and
    /// ``DownloadOptions/maxFileSize`` apply as to a download; the destination, mirrors, pieces
    /// and Metalink answers do not (a Metalink document is streamed as it is).
    ///
    /// `write` is called on the transport's thread with each chunk, in order, and may block: a
    /// full pipe holds the connection's reads, which is the backpressure. What it throws ends the
    /// stream as a file-system error on `-`.
    /// - Returns: the result, with `path` `-`.
    /// - Throws: ``PickupError``.
    public func stream(_ request: DownloadRequest, write: @escaping @Sendable (UnsafeRawBufferPointer) throws -> Void,
                       onEvent: @escaping @Sendable (DownloadEvent) -> Void = { _ in }) async throws(PickupError) -> DownloadResult
    {
        try DownloadURL.check(request.url)
        return try await StreamRun(request: request, options: options, write: write, onEvent: onEvent).run(on: transport)
    }
}

/// One stream's state. The sink changes it on the transport's thread, the run between requests.
final class StreamRun: @unchecked Sendable {
    let request: DownloadRequest
    let options: DownloadOptions
    let write: @Sendable (UnsafeRawBufferPointer) throws -> Void
    let onEvent: @Sendable (DownloadEvent) -> Void
    let userHeaders: [RequestHeader]
    let lock = NIOLock()
    // Under `lock`:
    /// Bytes handed to `write`.
    var sent: Int64 = 0
    var total: Int64?
    var validators: Validators?
    var hasher: AnyHasher?
    var expected: ExpectedDigest?
    var jar: [Cookie]
    var meter = SpeedMeter()
    var lastTick = 0.0

    init(request: DownloadRequest, options: DownloadOptions, write: @escaping @Sendable (UnsafeRawBufferPointer) throws -> Void,
         onEvent: @escaping @Sendable (DownloadEvent) -> Void) {
        self.request = request
        self.options = options
        self.write = write
        self.onEvent = onEvent
        var headers = request.options.headers
        if !headers.contains(where: { $0.name.caseInsensitiveEquals("Authorization") }),
            let basic = RequestOptions.credentials(in: request.url) { headers.append(basic) }
        userHeaders = headers
        jar = request.options.cookies
        expected = request.checksum
        hasher = request.checksum.map { AnyHasher($0.algorithm) }
    }

    func run(on transport: any Transport) async throws(PickupError) -> DownloadResult {
        let started = Clock.monotonic()
        var url = request.url
        var redirects = 0, failuresInRow = 0, unresolved = 0
        var sentAtFailure: Int64 = 0
        while true {
            if Task.isCancelled { throw .interrupted }
            let (headers, context) = lock.withLock {
                (FileDownload.requestHeaders(offset: sent, end: .max, validators: validators, conditional: nil)
                    + RequestOptions.fields(for: url, original: request.url, headers: userHeaders, jar: jar, now: Clock.wallSeconds()),
                 RequestContext(offset: sent, validators: validators, totalLength: total))
            }
            let sink = StreamSink(run: self, url: url, context: context)
            var failure: String
            var retryAfter: Int64? = nil
            do {
                try await transport.fetch(FetchRequest(url: url, headers: headers), into: sink)
                // A body without a length ends with its connection.
                if sink.expectedEnd == nil, sink.taken { return try finish(started: started) }
                failure = "the response ended early"
            } catch let e as PickupError {
                throw e
            } catch is CancellationError {
                throw .interrupted
            } catch let e as TransportError {
                switch e {
                case .fatal, .protocolViolation, .refused: throw e.failure
                case .proxyRefused(let status, _) where status < 500: throw e.failure
                case .unresolved:
                    unresolved += 1
                    if unresolved > 2 { throw e.failure }
                case .transient, .stalled, .busy, .proxyRefused: break
                }
                failure = e.message
            } catch is StreamHeadSaid {
                failure = ""  // decided below, from the head
            } catch {
                throw .network("\(error)")
            }
            switch sink.decision {
            case .alreadyComplete?:
                return try finish(started: started)
            case .append?, .replace?:
                if sink.ended { return try finish(started: started) }
            case .redirect(let location)?:
                redirects += 1
                guard redirects <= options.maxRedirects else { throw .server(status: nil, "more than \(options.maxRedirects) redirects") }
                url = try FileDownload.resolveRedirect(location, from: url, allowInsecure: options.allowInsecureRedirects)
                continue
            case .retry(let after, let why)?:
                failure = why
                retryAfter = after
            case .fail(let status, let why)?:
                throw PickupError.refused(url, status: status, why: why)
            case .startOver(let why)?:
                throw .network("cannot go on where the connection dropped: \(why); standard output has the first \(ByteCount.format(context.offset))")
            case .notModified?, nil:
                break
            }
            let now = lock.withLock { sent }
            failuresInRow = now > sentAtFailure ? 1 : failuresInRow + 1
            sentAtFailure = now
            guard failuresInRow <= options.retry.maxAttemptsWithoutProgress,
                let delay = options.retry.delay(failuresInRow: failuresInRow, retryAfter: retryAfter, jitter: Double.random(in: 0...1))
            else { throw .network("\(failure) (gave up after \(failuresInRow) attempts without progress)") }
            onEvent(.notice("\(failure); retrying in \(String(format: "%.1f", delay)) s"))
            do { try await Task.sleep(nanoseconds: Seconds.nanoseconds(delay)) } catch { throw .interrupted }
        }
    }

    /// The end: every byte sent, checked against the checksum when there is one.
    func finish(started: Double) throws(PickupError) -> DownloadResult {
        let (bytes, digest, expected) = lock.withLock { (sent, hasher?.finalize(), self.expected) }
        if let expected, let digest, digest != expected.bytes {
            throw .verification("the \(ByteCount.format(bytes)) written to standard output do not match the \(expected.algorithm.rawValue) "
                + "of \(expected.source)")
        }
        return DownloadResult(outcome: .downloaded, path: "-", size: bytes, bytesTransferred: bytes, resumedFrom: 0,
                              elapsed: Clock.monotonic() - started, digest: expected)
    }

    /// A response's head: whether its body is the bytes that come next.
    func take(_ head: ResponseHead, decision: ResponseDecision, url: String) throws -> Bool {
        keepCookies(head, url: url)
        let next: (total: Int64?, validators: Validators)
        switch decision {
        case .append(let at, _, let total, let v) where at == lock.withLock({ sent }): next = (total, v)
        case .replace(let total, let v) where lock.withLock({ sent }) == 0: next = (total, v)
        case .replace:
            throw PickupError.network("the server sent the whole file again instead of the rest, and standard output "
                + "has the first \(ByteCount.format(lock.withLock { sent })) of it: cannot go on without splicing two responses")
        default: return false
        }
        if let max = options.maxFileSize, let total = next.total, total > max {
            throw PickupError.server(status: nil, "the file is larger than the maximum size allowed (\(ByteCount.format(max)))")
        }
        lock.withLock {
            total = next.total ?? total
            validators = next.validators
            if expected == nil, let given = DigestHeader.expected(reprDigest: head.combined("Repr-Digest"), digest: head.combined("Digest")),
                sent == 0
            {
                expected = given
                hasher = AnyHasher(given.algorithm)
            }
        }
        return true
    }

    /// A chunk of the body: written, counted, hashed; returns the speed limit's pause.
    func body(_ bytes: UnsafeRawBufferPointer) throws -> Double {
        do { try write(bytes) } catch { throw PickupError.io("-", error) }
        let now = Clock.monotonic()
        let tick = lock.withLock { () -> DownloadProgress? in
            sent += Int64(bytes.count)
            hasher?.update(bytes)
            guard now - lastTick >= options.progressInterval else { return nil }
            lastTick = now
            return DownloadProgress(bytesDone: sent, totalBytes: total, bytesPerSecond: meter.add(time: now, bytes: sent))
        }
        if let max = options.maxFileSize, lock.withLock({ sent }) > max {
            throw PickupError.server(status: nil, "the file is larger than the maximum size allowed (\(ByteCount.format(max)))")
        }
        if let tick { onEvent(.progress(tick)) }
        return request.limiters.reduce(0) { Swift.max($0, $1.take(bytes.count)) }
    }

    /// Cookies a response sets, kept for the rest of the stream (along a redirect chain).
    func keepCookies(_ head: ResponseHead, url: String) {
        guard let u = URL(string: url) else { return }
        let now = Clock.wallSeconds()
        let set = head.headers.filter { $0.name.caseInsensitiveEquals("Set-Cookie") }.prefix(Cookie.maxPerDomain)
            .compactMap { Cookie.parseSetCookie($0.value, from: u, now: now) }
            .filter { $0.name.utf8.count + $0.value.utf8.count <= Cookie.maxSize }
        guard !set.isEmpty else { return }
        lock.withLock {
            jar.removeAll { old in set.contains { $0.name == old.name && $0.domain == old.domain && $0.path == old.path } }
            jar = Cookie.capped(jar + set.filter { ($0.expires ?? .max) > now })
        }
    }
}

/// The head said what happens next (a redirect, a retry, a refusal): its body is not read.
struct StreamHeadSaid: SinkError {}

/// One response of a stream.
final class StreamSink: ResponseSink, @unchecked Sendable {
    let run: StreamRun
    let url: String
    let context: RequestContext
    // Set on the transport's thread, read after `fetch` returns.
    var decision: ResponseDecision?
    /// Whether the body is the bytes that come next; whether all of them have come.
    var taken = false
    var ended = false
    var expectedEnd: Int64?

    init(run: StreamRun, url: String, context: RequestContext) {
        self.run = run
        self.url = url
        self.context = context
    }

    func receiveHead(_ head: ResponseHead) throws {
        let decision = ResponseDecision.decide(head, context: context, now: Clock.wallSeconds())
        self.decision = decision
        guard try run.take(head, decision: decision, url: url) else { throw StreamHeadSaid() }
        taken = true
        switch decision {
        case .append(_, let end, _, _): expectedEnd = end
        case .replace(let total, _): expectedEnd = total
        default: expectedEnd = context.offset
        }
        if expectedEnd == context.offset { ended = true }
    }

    func receiveBody(_ bytes: UnsafeRawBufferPointer) throws -> Double {
        let pause = try run.body(bytes)
        let sent = run.lock.withLock { run.sent }
        if let expectedEnd, sent >= expectedEnd { ended = true }
        return pause
    }
}
