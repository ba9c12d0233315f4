import Foundation
import HTTPTypes
import SystemPackage

/// The server's answers no longer describe one representation: stop combining bytes.
struct RepresentationChanged: SinkError {
    let reason: String
}

/// How ``FileDownload/transferAll(file:conditional:)`` ended: every byte held, or a first answer
/// that made fetching unnecessary.
enum Transferred {
    /// Every byte is held (and the pieces checked).
    case complete
    /// A finished file's check: the server has the same file.
    case unchanged(FilePath, CompletionRecord)
    /// The URL answered with a Metalink document (``DownloadRequest/followMetalink``), read and
    /// parsed: nothing was written, and the caller downloads what it describes.
    case metalink(Metalink)
}

extension FileDownload {
    /// Runs connections until every byte is held, or a first answer made it unnecessary.
    func transferAll(file: PartialFile, conditional initial: (FilePath, CompletionRecord)?) async throws -> Transferred {
        var conditional = initial
        while true {
            let (stream, continuation) = AsyncStream<Void>.makeStream()
            state.withLockedValue { $0.newRound(connections: options.connections, wake: continuation) }
            let ended: RunState.RoundEnd
            do {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    let first = conditional
                    group.addTask {
                        defer { continuation.finish() }
                        try await self.connection(0, file: file, conditional: first)
                    }
                    for await _ in stream {
                        for id in 1..<max(1, state.withLockedValue { $0.connectionsAllowed(options.connections) }) {
                            group.addTask { try await self.connection(id, file: file, conditional: nil) }
                        }
                    }
                    // When every byte is held, connections still waiting on a range that others
                    // finished (a slow one whose tail was taken) are cancelled, not awaited.
                    while true {
                        do {
                            guard try await group.next() != nil else { break }
                        } catch is CancellationError where !Task.isCancelled && state.withLockedValue({ $0.isComplete }) {
                            continue
                        }
                        if state.withLockedValue({ $0.isComplete }) { group.cancelAll() }
                    }
                }
                let (early, complete) = state.withLockedValue { ($0.endedEarly, $0.scheduler?.isComplete ?? true) }
                if let early { return early }
                if complete {
                    let good = try await BlockingIO.run {
                        try self.request.pieces.map { try self.verifyPieces($0, file: file) } ?? true
                            ? try self.searchForTheBadSource(file: file) : false
                    }
                    if good { return .complete }
                    ended = .hashFailed
                } else {
                    ended = .rangesLeft
                }
            } catch let change as RepresentationChanged {
                ended = .changed(change.reason)
            }
            // What the run does next (``RunState/roundEnded(_:maxRestarts:connections:)``).
            switch state.withLockedValue({ $0.roundEnded(ended, maxRestarts: options.retry.maxAttemptsWithoutProgress, connections: options.connections) }) {
            case .again:
                continue
            case .startOver(let notice):
                onEvent(.notice(notice))
                try await restartFromZero(file)
                conditional = nil
            case .fail(let error):
                throw error
            }
        }
    }

    /// One connection: fetches its range, then takes more work from the state until none is left.
    /// What it does next is the state's say (``RunState/connection(_:_:now:connections:)``): this
    /// runs it.
    func connection(_ id: Int, file: PartialFile, conditional: (FilePath, CompletionRecord)?) async throws {
        // Each connection asks one source at a time: the first asks the URL given first (unless
        // it was rejected or sent a bad piece), the others the best source with room.
        // A finished file is asked about at the source whose validators it has.
        var action = step(id, .opens(finishedAt: conditional?.1.source))
        if case .none = action { return }
        defer {
            // The connection the tuner kept left with bytes to fetch: the held ones go on.
            if state.withLockedValue({ $0.connectionLeft(id) }) { bringHeldBack() }
        }
        var conditional = conditional
        while true {
            switch action {
            case .fetch(let cursor, let asked):
                let outcome = try await fetchRange(id, cursor: cursor, file: file, conditional: asked ? conditional : nil)
                conditional = nil  // (the finished file's check is the first request's)
                switch outcome {
                case .done: action = step(id, .rangeDone)
                case .cut: action = step(id, .rangeCut)
                case .retired: action = step(id, .retired)
                case .ended(let early): action = step(id, .ended(early))
                }
            case .wait(let seconds):
                // Endgame: out of work while other ranges are still running; wait until one of
                // them could count as stalled and ask again (cancelled when every byte is held).
                try await Task.sleep(nanoseconds: Seconds.nanoseconds(seconds))
                action = step(id, .waited)
            case .waitForRestore:
                // Shed (see ``ConnectionTuner``): wait in case the connections are brought back;
                // the wait ends by cancellation when the download is complete.
                try await restore.wait()
                action = step(id, .restored)
            case .stop, .none:
                return
            }
        }
    }

    /// Applies connection `id`'s `event` to the run's state: what it does next.
    func step(_ id: Int, _ event: RunState.ConnectionEvent) -> RunState.ConnectionAction {
        state.withLockedValue { $0.connection(id, event, now: Clock.monotonic(), connections: options.connections) }
    }

    enum RangeOutcome {
        case done, retired
        /// Done, its response cut short (another connection took the rest of the range), which
        /// closed its connection; only where ranges go in pieces (``piecewise(_:)``).
        case cut
        /// The run ends without every byte fetched (``Transferred/unchanged(_:_:)`` or ``Transferred/metalink(_:)``).
        case ended(Transferred)
    }

    /// Fetches one range with retries until it is complete. The decisions are values'
    /// (``RunState`` for the run's, ``Attempt`` for this connection's); this runs them.
    func fetchRange(_ id: Int, cursor initial: SegmentCursor, file: PartialFile,
                    conditional initialConditional: (FilePath, CompletionRecord)?) async throws -> RangeOutcome
    {
        var cursor = initial
        var conditional = initialConditional
        var source = 0
        let (held, start, given) = state.withLockedValue { state -> (Int64, String, String) in
            source = state.sources.source(of: id) ?? 0
            return (state.heldAtMost(state.heldBytes), state.sources.url(source), state.sources.sources[source].url)
        }
        // "Progress" is more bytes held than ever before in this run, on any connection, since this
        // connection's previous failure (bytes that arrive elsewhere during a backoff count). New
        // bytes that replace held ones (a 200 cut short, again and again) are not progress.
        var attempt = Attempt(limits: Attempt.Limits(retry: options.retry, maxRedirects: options.maxRedirects,
                                                     allowInsecureRedirects: options.allowInsecureRedirects),
                              held: held, url: start, given: given)
        /// Goes on with source `to` (another mirror): its URL, its own redirects and failures, as `sources` has them.
        func move(to: Int, _ sources: SourceSet) {
            source = to
            conditional = nil  // a finished file's validators are one source's
            attempt.moved(to: sources.url(to), given: sources.sources[to].url)
        }
        /// The source's answer was `fault` (``RunState/sourceFault(_:at:_:why:)``): nil to go on
        /// with another source, else how the range ends.
        func leave(_ fault: RunState.SourceFault, why: String, status: Int = 0) throws -> RangeOutcome? {
            let (next, notice) = state.withLockedValue { state -> (RunState.AfterFault, String?) in
                let (next, notice) = state.sourceFault(id, at: source, fault, why: why)
                if case .moveTo(let to) = next { move(to: to, state.sources) }
                return (next, notice)
            }
            if let notice { onEvent(.notice(notice)) }
            switch next {
            case .moveTo: return nil
            case .leave: return .retired
            case .startOver: throw RepresentationChanged(reason: why)
            case .fail: throw PickupError.refused(attempt.url, status: status, why: why)
            }
        }
        while true {
            try Task.checkCancellation()
            // What the run says before this attempt, in one look (``RunState/beforeAttempt(_:at:holding:)``),
            // with the fields to send and the quickest answer so far (the pieces' length); none
            // after an fsync failed (``RunState/syncFailure``).
            let holding = cursor.position.load(ordering: .relaxed) > 0
            let (before, fields, latency) = try state.withLockedValue { state throws -> (RunState.BeforeAttempt, HTTPFields, Double?) in
                if let failed = state.syncFailure { throw failed }
                let before = state.beforeAttempt(id, at: source, holding: holding)
                guard case .go(let to, _, _, _, _) = before else { return (before, [:], nil) }
                if to != source { move(to: to, state.sources) }
                return (before, self.fields(for: attempt.url, source: source, in: state), state.quickestAnswer)
            }
            guard case .go(_, let several, let validators, let total, let patience) = before else {
                if before == .noConfirmer { throw RepresentationChanged(reason: "no source that can confirm the bytes held is left") }
                return .retired
            }
            let url = attempt.url
            var offset = cursor.position.load(ordering: .relaxed)
            let end = cursor.end.load(ordering: .relaxed)
            if conditional == nil, offset >= end || (total != nil && offset >= total!) { return .done }
            if offset > 0, validators?.ifRange == nil, total == nil {
                onEvent(.notice("the connection dropped and the server gives neither a validator nor a length, so the download must start again from zero"))
                try await restartFromZero(file)
                cursor = state.withLockedValue { $0.firstWriter() }
                offset = 0
            }
            // With several sources the length is the file's identity: every response must agree on it.
            let context = RequestContext(offset: offset, validators: offset > 0 ? validators : nil,
                                         totalLength: offset > 0 || several ? total : nil,
                                         finished: conditional.flatMap { c in c.1.validators.map { ($0, c.1.length) } })
            // In pieces only where responses may be combined (a strong validator for If-Range), one source,
            // several connections, over TLS (``piecewise(_:)``).
            let inPieces = !several && validators?.ifRange != nil && options.connections > 1 && piecewise(url)
            let last = inPieces ? RangeRequest.pieceEnd(offset: offset, end: end, rate: cursor.rate(now: Clock.monotonic()), latency: latency) : end
            let headers = RangeRequest.headers(offset: offset, end: last, validators: validators, conditional: conditional?.1.validators) + fields
            let sink = BodyWriter(download: self, context: context, file: file, cursor: cursor, url: url, connection: id,
                                  source: source)
            var failure: Attempt.Failure? = nil
            let began = Clock.monotonic()
            // However the attempt ends (done, split, failed, cancelled): what its source wrote and how fast.
            let asked = source
            defer {
                if let from = sink.firstOffset {
                    let to = sink.cursor.position.load(ordering: .relaxed)
                    let seconds = Clock.monotonic() - began
                    state.withLockedValue { $0.attemptEnded(id, source: asked, wrote: from, to: to, seconds: seconds) }
                }
            }
            do {
                // A first request (no length known yet) may share an HTTP/2 connection; ranges do not.
                let request = FetchRequest(url: url, headers: headers, lane: laneBase &+ id, patience: patience,
                                           multiplex: options.multiplex && offset == 0 && total == nil)
                try await transport.fetch(request, into: sink)
            } catch let stopped as SinkStopped {
                switch stopped.why {
                case .rangeComplete: return piecewise(url) ? .cut : .done
                case .metalink: return .ended(.metalink(try await readMetalink(at: url)))
                case .rejected(let reason, let otherFile):
                    // This source's answer is not this file (another length, no ranges, other
                    // validators): retired, and the range goes on from another source.
                    if let ended = try leave(.notThisFile(otherFile: otherFile), why: reason) { return ended }
                    continue
                case .nothingToRead:
                    // The head said all there is to know (an unchanged file sent again, or a range
                    // dropped when another response replaced every held byte): decided below.
                    break
                }
            } catch let e as TransportError {
                // Slow to start (an archive built on the fly, cold storage) or slow again: the
                // next attempt waits longer (doubling, up to the transport's bound).
                let (patience, known) = state.withLockedValue { state -> (Int, Attempt.Facts?) in
                    guard case .stalled = e else { return (0, state.facts(for: id, holding: 0)) }
                    return (state.stalled(id, beforeBody: !sink.gotBody), state.facts(for: id, holding: 0))
                }
                let facts = known ?? Attempt.Facts(held: 0, othersFetching: false)
                let stalled = patience > 0 ? transport.stallTimeout(patience: patience).map {
                    "\(e.message); waiting up to \(TransportError.seconds($0)) next time"
                } : nil
                switch attempt.classify(e, connection: id, facts: facts, stalled: stalled) {
                case .failure(let f): failure = f
                case .leave(let notice):
                    onEvent(.notice(notice))
                    return .retired
                case .fail(let error): throw error
                }
            }
            cursor = sink.cursor
            // Stopped meanwhile (another connection went on alone), else what the run says now.
            guard let facts = state.withLockedValue({ $0.facts(for: id, holding: $0.heldBytes) }) else { return .retired }
            if sink.decision?.writes == true { conditional = nil }
            let position = cursor.position.load(ordering: .relaxed)
            let response = Attempt.Response(decision: sink.decision, failure: failure, advanced: position > offset, position: position,
                                            limit: min(cursor.end.load(ordering: .relaxed), facts.total ?? .max),
                                            finishedResponse: sink.finishedResponse, status: sink.status, conditional: conditional != nil)
            switch attempt.answered(response) {
            case .again: continue
            case .redirected:
                // Further requests to this source start there (one source: the first connection's say).
                if several || id == 0 { state.withLockedValue { $0.redirected(source, to: attempt.url) } }
                continue
            case .done(let lengthIsHeld):
                if lengthIsHeld { state.withLockedValue { $0.unknownLengthEnded(writtenBy: cursor) } }
                return .done
            case .unchanged:
                guard let conditional else { return .done }
                return .ended(.unchanged(conditional.0, conditional.1))
            case .fault(let fault, let why, let status):
                if let ended = try leave(fault, why: why, status: status) { return ended }
                continue
            case .fail(let error): throw error
            case .failed(let failure):
                switch try await afterFailure(failure, id, source: source, facts: facts, attempt: &attempt) {
                case .again: continue
                case .moveTo(let to): move(to: to, state.withLockedValue { $0.sources })
                case .retired: return .retired
                }
            }
        }
    }

    enum AfterFailure { case again, moveTo(Int), retired }

    /// A counted failure of connection `id` at `source`: what the run's state decides
    /// (``RunState/failed(_:connection:source:attempt:facts:jitter:)``), run: a backoff (or the
    /// end of this connection, or of the download).
    func afterFailure(_ failure: Attempt.Failure, _ id: Int, source: Int, facts: Attempt.Facts,
                      attempt: inout Attempt) async throws -> AfterFailure {
        let jitter = Double.random(in: 0...1)
        let (next, notices) = state.withLockedValue {
            $0.failed(failure, connection: id, source: source, attempt: &attempt, facts: facts, jitter: jitter)
        }
        for notice in notices { onEvent(.notice(notice)) }
        switch next {
        case .moveTo(let to): return .moveTo(to)
        case .leave: return .retired
        case .fail(let error): throw error
        case .backOff(let delay):
            checkpointSoon()
            try await Task.sleep(nanoseconds: Seconds.nanoseconds(delay))
            return .again
        }
    }

    /// Whether ranges from `url` are asked for in pieces (``RangeRequest/pieceEnd(offset:end:rate:latency:)``)
    /// and a connection whose response was cut leaves (``DownloadOptions/piecewise``; by default
    /// over TLS only, where a connection costs a handshake: over plain HTTP a new TCP connection
    /// costs less than the pieces' requests, a tenth more CPU for 1 GiB on loopback).
    func piecewise(_ url: String) -> Bool {
        options.piecewise ?? url.lowercased().hasPrefix("https:")
    }
}
