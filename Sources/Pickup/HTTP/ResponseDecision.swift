/// What the client knew when it sent a request for the bytes from `offset` on.
public struct RequestContext: Sendable, Equatable {
    /// The first byte asked for (`Range: bytes=offset-`). Zero for a fresh download.
    public var offset: Int64
    /// Validators of the bytes already held (nil when nothing is held or none were given).
    public var validators: Validators?
    /// The complete length, when a previous response told it.
    public var totalLength: Int64?
    /// True when the request carried `If-None-Match`/`If-Modified-Since` (checking a finished file).
    public var conditional: Bool { finished != nil }
    /// When checking a finished file: its validators and length (from its completion record).
    public var finished: (validators: Validators, length: Int64)?

    /// A request context.
    public init(offset: Int64, validators: Validators?, totalLength: Int64?,
                finished: (validators: Validators, length: Int64)? = nil) {
        self.offset = offset
        self.validators = validators
        self.totalLength = totalLength
        self.finished = finished
    }

    public static func == (a: RequestContext, b: RequestContext) -> Bool {
        a.offset == b.offset && a.validators == b.validators && a.totalLength == b.totalLength
            && a.finished?.validators == b.finished?.validators && a.finished?.length == b.finished?.length
    }
}

/// What to do with a response to a (possibly ranged, possibly conditional) GET.
public enum ResponseDecision: Equatable, Sendable {
    /// A 206 that continues exactly at the requested offset: write its body there.
    /// `end` is one past its last byte.
    case append(at: Int64, end: Int64, total: Int64?, validators: Validators)
    /// A 200: the whole representation follows; discard held bytes and write from zero.
    case replace(total: Int64?, validators: Validators)
    /// Every byte is already held (416 confirming the length and validators).
    case alreadyComplete
    /// The held bytes cannot be combined with what the server offers: discard them and ask again
    /// from zero. The reason is for the user.
    case startOver(String)
    /// 304: the finished file is current.
    case notModified
    /// A redirect to this location (absolute or relative).
    case redirect(String)
    /// A transient failure: try again, after the server's `Retry-After` when it gave one.
    case retry(after: Int64?, reason: String)
    /// A failure that retrying will not fix (4xx, or a response that breaks the protocol).
    case fail(status: Int, reason: String)

    /// Decides, following RFC 9110 §14 and §15.3.7, and never combining bytes of two versions.
    public static func decide(_ head: ResponseHead, context: RequestContext, now: Int64) -> ResponseDecision {
        let v = head.validators
        // A server that ignores If-None-Match / If-Modified-Since but answers with the finished
        // file's strong validator and length is sending the same file again: it is unchanged.
        if let (held, length) = context.finished, head.status == 200 || head.status == 206,
            let strong = v.ifRange, strong == held.ifRange, completeLength(head) == length
        {
            return .notModified
        }
        switch head.status {
        case 206:
            return decidePartial(head, validators: v, context: context)
        case 200:
            return .replace(total: head.contentLength, validators: v)
        case 304:
            return context.conditional
                ? .notModified : .fail(status: 304, reason: "304 Not Modified to an unconditional request")
        case 301, 302, 303, 307, 308:
            guard let location = head["Location"], !location.isEmpty else {
                return .fail(status: head.status, reason: "redirect \(head.status) without a Location")
            }
            return .redirect(location)
        case 416:
            if case .unsatisfied(let complete)? = head["Content-Range"].flatMap(ContentRange.init),
                complete == context.offset, context.offset > 0,
                let held = context.validators, held.ifRange != nil, held.consistent(with: v),
                v.etag != nil || v.lastModified != nil
            {
                return .alreadyComplete
            }
            if context.offset == 0, case .unsatisfied(0)? = head["Content-Range"].flatMap(ContentRange.init) {
                return .alreadyComplete  // an empty representation has no satisfiable range
            }
            return .startOver("the server could not satisfy the range (416) and did not confirm the file")
        case 408, 429, 500...599:
            let after = head["Retry-After"].flatMap { RetryAfter.seconds($0, now: now) }
            return .retry(after: after, reason: "server answered \(head.status)")
        case 400...499:
            return .fail(status: head.status, reason: "server answered \(head.status)")
        default:
            return .fail(status: head.status, reason: "unexpected status \(head.status)")
        }
    }

    /// The complete length a 200 (Content-Length) or 206 (Content-Range) announces.
    static func completeLength(_ head: ResponseHead) -> Int64? {
        if head.status == 206, case .range(_, _, let complete?)? = head["Content-Range"].flatMap(ContentRange.init) {
            return complete
        }
        return head.status == 200 ? head.contentLength : nil
    }

    static func decidePartial(_ head: ResponseHead, validators v: Validators, context: RequestContext)
        -> ResponseDecision
    {
        let broken: (String) -> ResponseDecision = { why in
            context.offset > 0 ? .startOver(why) : .fail(status: 206, reason: why)
        }
        guard let raw = head["Content-Range"] else {
            return broken("206 without a single Content-Range (multipart or malformed)")
        }
        guard case .range(let first, let last, let complete)? = ContentRange(raw) else {
            return broken("malformed Content-Range '\(raw)'")
        }
        guard first == context.offset else {
            return broken("Content-Range starts at \(first), asked for \(context.offset)")
        }
        if let known = context.totalLength, let complete, known != complete {
            return broken("complete length changed from \(known) to \(complete)")
        }
        if let length = head.contentLength, length != last - first + 1 {
            return broken("Content-Length \(length) disagrees with Content-Range '\(raw)'")
        }
        if let held = context.validators, context.offset > 0, !held.consistent(with: v) {
            return broken("the file changed on the server (validators differ)")
        }
        var merged = v
        if merged.etag == nil, merged.lastModified == nil, let held = context.validators { merged = held }
        return .append(at: first, end: last + 1, total: complete ?? context.totalLength, validators: merged)
    }
}

extension ResponseDecision {
    /// Whether the body of this response is file content.
    var writes: Bool {
        switch self {
        case .append, .replace: true
        default: false
        }
    }
}
