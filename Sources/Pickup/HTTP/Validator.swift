/// An entity tag (RFC 9110 §8.8.3): an opaque tag, strong unless prefixed with `W/`.
public struct EntityTag: Equatable, Sendable, Codable {
    /// The quoted tag as sent, without the `W/` prefix, e.g. `"abc"`.
    public var opaque: String
    /// Weak tags may not be used in `If-Range` or for byte-range combination.
    public var isWeak: Bool

    /// Parses an `ETag` header value; nil when it is not a well-formed entity tag.
    public init?(_ header: String) {
        var s = Substring(header).trimmingSpaces
        var weak = false
        if s.hasPrefix("W/") {
            weak = true
            s = s.dropFirst(2)
        }
        guard s.count >= 2, s.first == "\"", s.last == "\"" else { return nil }
        let inner = s.dropFirst().dropLast()
        // etagc = %x21 / %x23-7E / obs-text
        guard inner.unicodeScalars.allSatisfy({ $0.value == 0x21 || ($0.value >= 0x23 && $0.value != 0x7F) })
        else { return nil }
        self.opaque = String(s)
        self.isWeak = weak
    }

    /// The header value (`W/"x"` or `"x"`).
    public var headerValue: String { isWeak ? "W/" + opaque : opaque }

    /// Strong comparison (RFC 9110 §8.8.3.2): both strong and the same opaque tag.
    public func strongMatches(_ other: EntityTag) -> Bool {
        !isWeak && !other.isWeak && opaque == other.opaque
    }
}

/// What identifies one version of a resource: the validators a response carried.
///
/// A resumed range is combined with bytes already held only when the server confirms, through
/// `If-Range`, that the representation is the one these validators name.
public struct Validators: Equatable, Sendable, Codable {
    /// The `ETag`, strong or weak.
    public var etag: EntityTag?
    /// The `Last-Modified` header value as sent.
    public var lastModified: String?
    /// Whether `lastModified` counts as strong (RFC 9110 §8.8.2.2): at least 60 s before `Date`.
    public var lastModifiedIsStrong: Bool

    /// Validators from response headers (`ETag`, `Last-Modified`, `Date`).
    public init(etag: String?, lastModified: String?, date: String?) {
        self.etag = etag.flatMap(EntityTag.init)
        self.lastModified = lastModified
        if let lm = lastModified.flatMap(HTTPDate.parse), let d = date.flatMap(HTTPDate.parse) {
            self.lastModifiedIsStrong = d - lm >= 60
        } else {
            self.lastModifiedIsStrong = false
        }
    }

    /// Validators with explicit fields.
    public init(etag: EntityTag?, lastModified: String?, lastModifiedIsStrong: Bool) {
        self.etag = etag
        self.lastModified = lastModified
        self.lastModifiedIsStrong = lastModifiedIsStrong
    }

    /// The value to send in `If-Range`, following RFC 9110 §13.1.5: a strong ETag; else a
    /// Last-Modified date only if there is no ETag at all and the date is strong; else nothing
    /// (and then bytes must not be combined across requests).
    public var ifRange: String? {
        if let etag {
            return etag.isWeak ? nil : etag.headerValue
        }
        if let lastModified, lastModifiedIsStrong { return lastModified }
        return nil
    }

    /// True when a later response names the same representation, by strong comparison.
    ///
    /// A response that omits a validator we hold is not a contradiction (many servers leave
    /// them off 206 and 416); one that sends a different value is.
    public func consistent(with later: Validators) -> Bool {
        if let mine = etag, let theirs = later.etag {
            if mine.isWeak || theirs.isWeak { return mine.opaque == theirs.opaque && mine.isWeak == theirs.isWeak }
            return mine.strongMatches(theirs)
        }
        if etag == nil, later.etag == nil, let mine = lastModified, let theirs = later.lastModified {
            return mine == theirs
        }
        if etag == nil, later.etag != nil, ifRange != nil { return false }
        return true
    }

    /// Whether these validators can make a conditional GET (`If-None-Match`/`If-Modified-Since`).
    public var canRevalidate: Bool { etag != nil || lastModified != nil }
}

extension Substring {
    var trimmingSpaces: Substring {
        var s = self
        while let f = s.first, f == " " || f == "\t" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" { s = s.dropLast() }
        return s
    }
}
