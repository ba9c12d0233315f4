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
        a.moved()
        #expect(a.classify(.unresolved(host: "h"), connection: 0, facts: alone) == .failure(.init(message: "cannot resolve h")))
    }

    @Test func redirectsAndTheGivenURLAreBounded() {
        var a = Attempt(limits: limits, held: 0)
        for _ in 0..<3 { #expect(a.redirected() == nil) }
        #expect(a.redirected() == .server(status: nil, "more than 3 redirects"))
        let asked = [a.askGivenURLAgain(status: 404, redirectedAway: false), a.askGivenURLAgain(status: 500, redirectedAway: true),
                     a.askGivenURLAgain(status: 404, redirectedAway: true), a.askGivenURLAgain(status: 410, redirectedAway: true)]
        #expect(asked == [false, false, true, false])
        a.moved()
        let again = a.askGivenURLAgain(status: 403, redirectedAway: true)
        #expect(a.redirected() == nil && again)
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
                                       facts: .init(held: 0, othersFetching: false, several: true, heldConfirmed: false), jitter: 0)
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
                    a.moved()
                    unresolvedSinceMove = 0
                }
                let facts = Attempt.Facts(held: held, othersFetching: Bool.random(using: &rng), several: Int.random(in: 0..<4, using: &rng) == 0,
                                          heldConfirmed: Int.random(in: 0..<5, using: &rng) != 0)
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
                        a.moved()
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
                    #expect(facts.several && facts.heldConfirmed && a.failuresInRow <= limits.retry.maxAttemptsWithoutProgress)
                    #expect(tooLong == (failure.retryAfter.map { Double($0) > 60 } ?? false))
                    next = a.afterSources(failure, connection: 1, facts: facts, jitter: Double.random(in: 0...1, using: &rng))
                } else if facts.several, facts.heldConfirmed, a.failuresInRow <= limits.retry.maxAttemptsWithoutProgress {
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
}
