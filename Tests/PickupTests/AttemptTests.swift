import Foundation
import Testing

@testable import Pickup

/// A connection's retry policy without a server: the bounds it keeps, whatever comes.
@Suite struct AttemptTests {
    let limits = Attempt.Limits(retry: RetryPolicy(maxAttemptsWithoutProgress: 4, baseDelay: 0.5, maxDelay: 8, maxRetryAfter: 60),
                                maxRedirects: 3)

    @Test func oneConnectionBacksOffThenGivesUpWithoutProgress() {
        var a = Attempt(limits: limits, held: 100)
        let facts = Attempt.Facts(held: 100, othersFetching: false)
        for n in 1...4 {
            guard case .backOff(let s, let notice) = a.failed(.init(message: "reset"), connection: 0, facts: facts, jitter: 1) else {
                Issue.record("attempt \(n) should back off")
                return
            }
            #expect(s <= 8 && notice.hasPrefix("reset; retrying in "), "\(notice)")
        }
        #expect(a.failed(.init(message: "reset"), connection: 0, facts: facts, jitter: 1)
                == .fail(.network("reset (gave up after 5 attempts without progress)")))
        // Progress anywhere starts the count again.
        var b = Attempt(limits: limits, held: 0)
        for held in 1...20 {
            let next = b.failed(.init(message: "reset"), connection: 0, facts: .init(held: Int64(held), othersFetching: false), jitter: 0)
            guard case .backOff = next else { Issue.record("\(next)"); return }
            #expect(b.failuresInRow == 1)
        }
    }

    @Test func anotherConnectionLeavesInsteadOfGivingUpTheDownload() {
        var a = Attempt(limits: limits, held: 0)
        let others = Attempt.Facts(held: 0, othersFetching: true)
        var actions: [Attempt.Action] = []
        for _ in 0..<4 { actions.append(a.failed(.init(message: "refused"), connection: 2, facts: others, jitter: 0)) }
        // Three failures of its own back off; the fourth leaves its range to the others.
        #expect(actions.dropLast().allSatisfy { if case .backOff = $0 { true } else { false } }, "\(actions)")
        #expect(actions.last == .leave(notice: "connection 3 retired: 4 failures in a row: refused"))
        // Bytes it wrote end its own count.
        var b = Attempt(limits: limits, held: 0)
        for i in 0..<10 {
            b.wrote()
            let next = b.failed(.init(message: "x"), connection: 0, facts: .init(held: Int64(i + 1), othersFetching: true), jitter: 0)
            guard case .backOff = next else { Issue.record("\(next)"); return }
        }
    }

    @Test func transportErrorsAreClassified() {
        var a = Attempt(limits: limits, held: 0)
        let alone = Attempt.Facts(held: 0, othersFetching: false), others = Attempt.Facts(held: 0, othersFetching: true)
        #expect(a.classify(.fatal("tls"), connection: 0, facts: alone) == .fail(.network("tls")))
        #expect(a.classify(.protocolViolation("bad"), connection: 0, facts: alone) == .fail(.server(status: nil, "bad")))
        #expect(a.classify(.proxyRefused(status: 403, reason: "Forbidden"), connection: 0, facts: alone)
                == .fail(.server(status: 403, "the proxy refused: 403 Forbidden")))
        #expect(a.classify(.proxyRefused(status: 502, reason: "Bad Gateway"), connection: 0, facts: alone)
                == .failure(.init(message: "the proxy answered 502 Bad Gateway")))
        #expect(a.classify(.busy("421 too many"), connection: 1, facts: others) == .leave(notice: "connection 2 retired: 421 too many"))
        #expect(a.classify(.busy("421 too many"), connection: 0, facts: alone) == .failure(.init(message: "421 too many", busy: true)))
        #expect(a.classify(.stalled(seconds: 15), connection: 0, facts: alone, stalled: "slow; waiting up to 30 s next time")
                == .failure(.init(message: "slow; waiting up to 30 s next time")))
        // A name that does not resolve: two more tries, then said; another source starts again.
        #expect(a.classify(.unresolved(host: "h"), connection: 0, facts: alone) == .failure(.init(message: "cannot resolve h")))
        #expect(a.classify(.unresolved(host: "h"), connection: 0, facts: alone) == .failure(.init(message: "cannot resolve h")))
        #expect(a.classify(.unresolved(host: "h"), connection: 0, facts: alone) == .fail(.network("cannot resolve h")))
        a.moved(to: "http://m/", given: "http://m/")
        #expect(a.classify(.unresolved(host: "h"), connection: 0, facts: alone) == .failure(.init(message: "cannot resolve h")))
    }

    @Test func redirectsAndTheGivenURLAreBounded() {
        var a = Attempt(limits: limits, held: 0, url: "https://a/f")
        let redirect = Attempt.Response(decision: .redirect("/g"))
        for _ in 0..<3 { #expect(a.answered(redirect) == .redirected) }
        #expect(a.url == "https://a/g" && a.given == "https://a/f")
        #expect(a.answered(redirect) == .fail(.server(status: nil, "more than 3 redirects")))
        // A refusal from where a redirect led: the given URL once more, then the source's fault.
        func refused(_ status: Int) -> Attempt.Response { .init(decision: .fail(status: status, reason: "no"), status: status) }
        #expect(a.answered(refused(500)) == .fault(.refused, why: "no", status: 500))
        #expect(a.answered(refused(404)) == .again && a.url == "https://a/f")
        #expect(a.answered(refused(404)) == .fault(.refused, why: "no", status: 404), "at the given URL: refused")
        #expect(a.answered(redirect) == .fail(.server(status: nil, "more than 3 redirects")))
        #expect(a.answered(refused(410)) == .fault(.refused, why: "no", status: 410), "asked again once only")
        // Another source starts from zero: its own redirects and its own retry of its given URL.
        a.moved(to: "https://b/x", given: "https://b/f")
        #expect(a.answered(refused(403)) == .again && a.url == "https://b/f")
        #expect(a.answered(redirect) == .redirected && a.url == "https://b/g")
        // Redirects are checked as the user's URL is: never from https to plain http unless allowed.
        #expect(a.answered(.init(decision: .redirect("http://b/h"))) == .fail(.server(status: nil,
            "refusing redirect from https to http (http://b/h); use --insecure to allow")))
        var insecure = Attempt(limits: .init(retry: limits.retry, maxRedirects: 3, allowInsecureRedirects: true), held: 0, url: "https://a/f")
        #expect(insecure.answered(.init(decision: .redirect("http://b/h"))) == .redirected && insecure.url == "http://b/h")
        if case .fail = a.answered(.init(decision: .redirect("ftp://b/h"))) {} else { Issue.record("an ftp redirect is refused") }
    }

    /// What a response comes to: the next piece at once, done (its length held when none was
    /// known), short (a failure), unchanged, a changed file, a server's retry; a writing response
    /// ends the connection's failures in a row.
    @Test func aResponseDecidesTheNextStep() {
        let v = Validators(etag: nil, lastModified: nil, date: nil)
        let append = ResponseDecision.append(at: 0, end: 100, total: 1000, validators: v)
        var a = Attempt(limits: limits, held: 0, url: "http://a/f")
        // A whole response to a piece: the next at once; the range's end: done; short: a failure.
        #expect(a.answered(.init(decision: append, advanced: true, position: 100, limit: 1000, finishedResponse: true)) == .again)
        #expect(a.answered(.init(decision: append, advanced: true, position: 1000, limit: 1000, finishedResponse: true))
                == .done(lengthIsHeld: false))
        #expect(a.answered(.init(decision: append, advanced: true, position: 10, limit: 1000))
                == .failed(.init(message: "the response ended after 10 B of 1000 B")))
        // No length known: the end of the body is the file's end.
        #expect(a.answered(.init(decision: .replace(total: nil, validators: v), advanced: true, position: 7)) == .done(lengthIsHeld: true))
        #expect(a.answered(.init(decision: .alreadyComplete)) == .done(lengthIsHeld: true))
        // A transport failure during a body counts, whatever the head said.
        let dropped = Attempt.Failure(message: "dropped")
        #expect(a.answered(.init(decision: append, failure: dropped, advanced: true, position: 10, limit: 1000)) == .failed(dropped))
        #expect(a.answered(.init(failure: dropped)) == .failed(dropped))
        #expect(a.answered(.init()) == .again, "no head and no failure (a range dropped meanwhile): ask again")
        #expect(a.answered(.init(decision: .notModified, conditional: true)) == .unchanged)
        #expect(a.answered(.init(decision: .notModified)) == .done(lengthIsHeld: false))
        #expect(a.answered(.init(decision: .startOver("changed"))) == .fault(.changed, why: "changed", status: 0))
        #expect(a.answered(.init(decision: .retry(after: 5, reason: "busy"), status: 503))
                == .failed(.init(message: "busy", busy: true, retryAfter: 5)))
        #expect(a.answered(.init(decision: .retry(after: nil, reason: "5xx"), status: 500)) == .failed(.init(message: "5xx")))
        // Bytes written end the connection's own failures in a row (its retirement counts them).
        let facts = Attempt.Facts(held: 0, othersFetching: true)
        for _ in 0..<3 { _ = a.failed(dropped, connection: 1, facts: facts, jitter: 0) }
        #expect(a.ownFailures == 3)
        _ = a.answered(.init(decision: append, advanced: true, position: 20, limit: 1000))
        #expect(a.ownFailures == 0, "bytes written: \(a.ownFailures)")
        _ = a.failed(dropped, connection: 1, facts: facts, jitter: 0)
        _ = a.answered(.init(decision: append, advanced: false, position: 20, limit: 1000))
        _ = a.answered(.init(decision: .retry(after: nil, reason: "5xx"), advanced: true, status: 500))
        #expect(a.ownFailures == 1, "nothing of the file written: still counting")
    }

    @Test func severalSourcesAreAskedFirstAndALongRetryAfterIsNotWaitedFor() {
        var a = Attempt(limits: limits, held: 0)
        let mirrors = Attempt.Facts(held: 0, othersFetching: true, several: true)
        #expect(a.failed(.init(message: "503", busy: true, retryAfter: 5), connection: 0, facts: mirrors, jitter: 0)
                == .askSources(.init(message: "503", busy: true, retryAfter: 5), tooLong: false))
        #expect(a.failed(.init(message: "503", retryAfter: 3600), connection: 0, facts: mirrors, jitter: 0)
                == .askSources(.init(message: "503", retryAfter: 3600), tooLong: true))
        // Alone, a wait longer than we give fails in words.
        var b = Attempt(limits: limits, held: 0)
        #expect(b.failed(.init(message: "503", retryAfter: 3600), connection: 0, facts: .init(held: 0, othersFetching: false), jitter: 0)
                == .fail(.server(status: 503, "503; the server asks to retry after 3600 s")))
        // Until the held bytes are confirmed, the source that can confirm them is retried in place.
        var c = Attempt(limits: limits, held: 0)
        guard case .backOff = c.failed(.init(message: "x"), connection: 0,
                                       facts: .init(held: 0, othersFetching: false, several: true, confirmsHeld: true), jitter: 0)
        else { Issue.record("retried in place"); return }
    }

    /// Random failures, answers and facts: no connection backs off more than the budget allows in a
    /// row without progress, a wait is never longer than the policy's bounds, the last connection
    /// never leaves its range, a fatal error always fails, and several sources are always asked
    /// while the budget lasts.
    @Test func exploredAttemptsKeepTheirBounds() {
        var rng = SplitMix(state: propertySeed("PICKUP_ATTEMPT_SEED", "exploredAttemptsKeepTheirBounds"))
        for _ in 0..<300 {
            var a = Attempt(limits: limits, held: 0)
            var held: Int64 = 0
            var backOffsWithoutProgress = 0
            var lastHeldAtBackOff: Int64 = -1
            var unresolvedSinceMove = 0
            for _ in 0..<60 {
                if Int.random(in: 0..<5, using: &rng) == 0 { held += Int64.random(in: 1...1000, using: &rng) }
                if Int.random(in: 0..<20, using: &rng) == 0 {
                    a.moved(to: "http://m/", given: "http://m/")
                    unresolvedSinceMove = 0
                }
                let facts = Attempt.Facts(held: held, othersFetching: Bool.random(using: &rng), several: Int.random(in: 0..<4, using: &rng) == 0,
                                          confirmsHeld: Int.random(in: 0..<5, using: &rng) == 0)
                let errors: [TransportError] = [.transient("t"), .busy("b"), .stalled(seconds: 1), .unresolved(host: "h"), .fatal("f"),
                                                .protocolViolation("p"), .refused("r"), .proxyRefused(status: 407, reason: "x"),
                                                .proxyRefused(status: 502, reason: "y")]
                let error = errors.randomElement(using: &rng)!
                let classified = a.classify(error, connection: 1, facts: facts)
                switch error {
                case .fatal, .protocolViolation, .refused, .proxyRefused(status: 407, reason: _):
                    guard case .fail = classified else { Issue.record("\(error) → \(classified)"); return }
                    continue
                case .unresolved:
                    unresolvedSinceMove += 1
                    if unresolvedSinceMove > 2 {
                        guard case .fail = classified else { Issue.record("3rd unresolved → \(classified)"); return }
                        a.moved(to: "http://m/", given: "http://m/")
                        unresolvedSinceMove = 0
                        continue
                    }
                default: break
                }
                guard case .failure(var failure) = classified else {
                    #expect(facts.othersFetching, "only a connection with others leaves: \(classified)")
                    continue
                }
                if Bool.random(using: &rng) { failure.retryAfter = Int64.random(in: 0...120, using: &rng) }
                let progressed = held > a.heldAtLastFailure
                var next = a.failed(failure, connection: 1, facts: facts, jitter: Double.random(in: 0...1, using: &rng))
                if case .askSources(_, let tooLong) = next {
                    #expect(facts.several && !facts.confirmsHeld && a.failuresInRow <= limits.retry.maxAttemptsWithoutProgress)
                    #expect(tooLong == (failure.retryAfter.map { Double($0) > 60 } ?? false))
                    next = a.afterSources(failure, connection: 1, facts: facts, jitter: Double.random(in: 0...1, using: &rng))
                } else if facts.several, !facts.confirmsHeld, a.failuresInRow <= limits.retry.maxAttemptsWithoutProgress {
                    Issue.record("several sources are asked first: \(next)")
                }
                switch next {
                case .backOff(let seconds, _):
                    #expect(seconds >= 0 && seconds.isFinite && seconds <= 60, "\(seconds)")
                    if progressed || lastHeldAtBackOff != held { backOffsWithoutProgress = 0 }
                    backOffsWithoutProgress += 1
                    lastHeldAtBackOff = held
                    #expect(backOffsWithoutProgress <= limits.retry.maxAttemptsWithoutProgress, "bounded retries without progress")
                case .leave:
                    #expect(facts.othersFetching, "the last connection never leaves its range")
                case .fail:
                    #expect(!facts.othersFetching, "a connection with others leaves rather than failing the download")
                    a = Attempt(limits: limits, held: held)
                    backOffsWithoutProgress = 0
                    unresolvedSinceMove = 0
                case .askSources:
                    Issue.record("askSources after the sources answered")
                }
            }
        }
    }

    /// Random responses (every decision, hostile redirects, short and whole bodies, failures) and
    /// moves to other sources: at most `maxRedirects` redirects followed per source, the given URL
    /// asked again at most once per source, a range done only at its end (or when no length is
    /// known), the URL asked always http(s), and nothing traps.
    @Test func exploredResponsesKeepTheirBounds() {
        var rng = SplitMix(state: propertySeed("PICKUP_ATTEMPT_RESPONSE_SEED", "exploredResponsesKeepTheirBounds"))
        let v = Validators(etag: "\"e\"", lastModified: nil, date: nil)
        let locations = ["/a", "b", "https://m/c", "http://m/d", "ftp://m/e", "//m/f", "https://m:99999/g", "", "https://[::1/h",
                         "https://u:p@m/i", String(repeating: "x", count: 9000)]
        for _ in 0..<300 {
            var a = Attempt(limits: limits, held: 0, url: "https://m/given")
            var redirects = 0, givenAgain = 0
            for _ in 0..<40 {
                if Int.random(in: 0..<15, using: &rng) == 0 {
                    a.moved(to: "https://n/x", given: "https://n/given")
                    (redirects, givenAgain) = (0, 0)
                }
                let limit: Int64 = Bool.random(using: &rng) ? .max : Int64.random(in: 0...1000, using: &rng)
                let position = Int64.random(in: 0...1000, using: &rng)
                let status = [200, 206, 301, 403, 404, 410, 416, 429, 500, 503].randomElement(using: &rng)!
                let decisions: [ResponseDecision?] = [
                    nil, .append(at: 0, end: 1000, total: limit == .max ? nil : limit, validators: v), .replace(total: nil, validators: v),
                    .alreadyComplete, .startOver("s"), .notModified, .redirect(locations.randomElement(using: &rng)!),
                    .retry(after: Int64.random(in: 0...100, using: &rng), reason: "r"), .fail(status: status, reason: "f"),
                ]
                let r = Attempt.Response(decision: decisions.randomElement(using: &rng)!,
                                         failure: Bool.random(using: &rng) ? Attempt.Failure(message: "x") : nil,
                                         advanced: Bool.random(using: &rng), position: position, limit: limit,
                                         finishedResponse: Bool.random(using: &rng), status: status, conditional: Bool.random(using: &rng))
                let before = a.url
                let step = a.answered(r)
                switch step {
                case .redirected:
                    redirects += 1
                    #expect(redirects <= limits.maxRedirects, "redirects followed: \(redirects)")
                    #expect(a.url.hasPrefix("https://") && a.url.utf8.count <= DownloadURL.maxLength, "\(a.url)")
                case .again:
                    if a.url != before {
                        givenAgain += 1
                        #expect(givenAgain <= 1 && (a.url == "https://m/given" || a.url == "https://n/given"), "\(a.url)")
                    }
                case .done(let lengthIsHeld):
                    switch r.decision {
                    case .append?, .replace?:
                        #expect(r.failure == nil && (r.position >= r.limit || r.limit == .max) && lengthIsHeld == (r.limit == .max))
                    case .alreadyComplete?, .notModified?: break
                    default: Issue.record("done after \(String(describing: r.decision))")
                    }
                case .unchanged:
                    #expect(r.conditional && r.decision == .notModified)
                case .fault, .failed, .fail:
                    break
                }
            }
        }
    }
}
