import Foundation
import HTTPTypes
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
    /// `write` is called on a thread of the stream's own with each chunk, in order, and may block
    /// (``StreamOutput``): a reader that falls behind pauses the connection's reads, one that takes
    /// nothing for the transport's stall timeout at the end fails the stream. What it throws ends
    /// the stream as a file-system error on `-`.
    /// - Returns: the result, with `path` `-`.
    /// - Throws: ``PickupError``.
    public func stream(_ request: DownloadRequest, write: @escaping @Sendable (UnsafeRawBufferPointer) throws -> Void,
                       onEvent: @escaping @Sendable (DownloadEvent) -> Void = { _ in }) async throws(PickupError) -> DownloadResult
    {
        try DownloadURL.check(request.url)
        let run = StreamRun(request: request, options: options, write: write, onEvent: onEvent)
        do {
            return try await run.run(on: transport)
        } catch {
            run.output.abandon()
            throw error
        }
    }
}

/// One stream's state. The sink changes it on the transport's thread, the run between requests.
final class StreamRun: @unchecked Sendable {
    let request: DownloadRequest
    let options: DownloadOptions
    let output: StreamOutput
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
        output = StreamOutput(write: write)
        self.onEvent = onEvent
        userHeaders = RequestOptions.userHeaders(request.options.headers, for: request.url)
        jar = request.options.cookies
        expected = request.checksum
        hasher = request.checksum.map { AnyHasher($0.algorithm) }
    }

    func run(on transport: any Transport) async throws(PickupError) -> DownloadResult {
        let started = Clock.monotonic()
        let stall = transport.stallTimeout(patience: 0) ?? 15
        // One connection, one source: the same retry policy and redirects as a file's ranges (``Attempt``).
        var attempt = Attempt(limits: Attempt.Limits(retry: options.retry, maxRedirects: options.maxRedirects,
                                                     allowInsecureRedirects: options.allowInsecureRedirects),
                              held: 0, url: request.url)
        let alone = Attempt.Facts(held: 0, othersFetching: false)
        while true {
            if Task.isCancelled { throw .interrupted }
            let url = attempt.url
            // Going on where a connection dropped needs a strong validator (If-Range): without
            // one the rest could be another version's, spliced after bytes already handed over.
            let (held, resumable) = lock.withLock { (sent, validators?.ifRange != nil) }
            if held > 0, !resumable {
                throw .network("cannot go on where the connection dropped: the server gives no strong validator to resume "
                    + "with; standard output has the first \(ByteCount.format(held))")
            }
            let (headers, context) = lock.withLock {
                (RangeRequest.headers(offset: sent, end: .max, validators: validators, conditional: nil)
                    + RequestOptions.fields(for: url, original: request.url, headers: userHeaders, jar: jar, now: Clock.wallSeconds()),
                 RequestContext(offset: sent, validators: validators, totalLength: total))
            }
            let sink = StreamSink(run: self, url: url, context: context)
            var failure: Attempt.Failure
            do {
                try await transport.fetch(FetchRequest(url: url, headers: headers), into: sink)
                // A body without a length ends with its connection.
                if sink.expectedEnd == nil, sink.taken { return try await finish(started: started, stall: stall) }
                failure = Attempt.Failure(message: "the response ended early")
            } catch let e as PickupError {
                throw e
            } catch is CancellationError {
                throw .interrupted
            } catch let e as TransportError {
                switch attempt.classify(e, connection: 0, facts: alone) {
                case .failure(let f): failure = f
                case .fail(let error): throw error
                case .leave: throw e.failure  // (never alone)
                }
            } catch is StreamHeadSaid {
                failure = Attempt.Failure(message: "")  // decided below, from the head
            } catch {
                throw .network("\(error)")
            }
            switch sink.decision {
            case .alreadyComplete?:
                return try await finish(started: started, stall: stall)
            case .append?, .replace?:
                if sink.ended { return try await finish(started: started, stall: stall) }
            case .redirect(let location)?:
                if let error = attempt.follow(location) { throw error }
                continue
            case .retry(let after, let why)?:
                failure = Attempt.Failure(message: why, retryAfter: after)
            case .fail(let status, let why)?:
                throw PickupError.refused(url, status: status, why: why)
            case .startOver(let why)?:
                throw .network("cannot go on where the connection dropped: \(why); standard output has the first \(ByteCount.format(context.offset))")
            case .notModified?, nil:
                break
            }
            let now = lock.withLock { sent }
            if now > attempt.heldAtLastFailure { attempt.wrote() }
            var facts = alone
            facts.held = now
            switch attempt.failed(failure, connection: 0, facts: facts, jitter: Double.random(in: 0...1)) {
            case .backOff(let delay, let notice):
                onEvent(.notice(notice))
                do { try await Task.sleep(nanoseconds: Seconds.nanoseconds(delay)) } catch { throw .interrupted }
            case .fail(let error): throw error
            case .leave, .askSources: throw .network(failure.message)  // (never alone, never several)
            }
        }
    }

    /// The end: every byte written (waited for on the blocking pool, while the reader takes some
    /// within `stall` seconds), checked against the checksum when there is one.
    func finish(started: Double, stall: Double) async throws(PickupError) -> DownloadResult {
        do {
            try await BlockingIO.run { [output] in try output.close(stall: stall) }
        } catch let e as PickupError {
            throw e
        } catch {
            throw .io("-", error)
        }
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

    /// A chunk of the body: handed to the output, counted, hashed. Returns the pause to ask for
    /// (the output's, or the speed limit's) and the bytes handed over so far.
    func body(_ bytes: UnsafeRawBufferPointer) throws -> (pause: Double, sent: Int64) {
        if let max = options.maxFileSize, lock.withLock({ sent }) + Int64(bytes.count) > max {
            throw PickupError.server(status: nil, "the file is larger than the maximum size allowed (\(ByteCount.format(max)))")
        }
        let full = try output.put(bytes)
        let now = Clock.monotonic()
        let (tick, handed) = lock.withLock { () -> (DownloadProgress?, Int64) in
            sent += Int64(bytes.count)
            hasher?.update(bytes)
            guard now - lastTick >= options.progressInterval else { return (nil, sent) }
            lastTick = now
            return (DownloadProgress(bytesDone: sent, totalBytes: total, bytesPerSecond: meter.add(time: now, bytes: sent)), sent)
        }
        if let tick { onEvent(.progress(tick)) }
        return (request.limiters.reduce(full) { Swift.max($0, $1.take(bytes.count)) }, handed)
    }

    /// Cookies a response sets, kept for the rest of the stream (along a redirect chain).
    func keepCookies(_ head: ResponseHead, url: String) {
        let values = head.fields[values: .setCookie]
        guard !values.isEmpty else { return }
        lock.withLock { Cookie.keep(values, from: url, in: &jar, now: Clock.wallSeconds()) }
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
        // (`take` accepts only these two.)
        if case .append(_, let end, _, _) = decision { expectedEnd = end }
        if case .replace(let total, _) = decision { expectedEnd = total }
        if expectedEnd == context.offset { ended = true }
    }

    func receiveBody(_ bytes: UnsafeRawBufferPointer) throws -> Double {
        let (pause, sent) = try run.body(bytes)
        if let expectedEnd, sent >= expectedEnd { ended = true }
        return pause
    }
}
