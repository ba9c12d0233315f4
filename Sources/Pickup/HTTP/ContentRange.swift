/// A `Content-Range` header value (RFC 9110 §14.4), in its `bytes` unit.
///
/// Two forms matter to a downloader: `bytes first-last/complete` on a 206, where `complete` may
/// be `*` when the server does not know the length, and `bytes */complete` on a 416.
public enum ContentRange: Equatable, Sendable {
    /// `bytes first-last/complete`: the inclusive byte range sent, and the whole length if known.
    case range(first: Int64, last: Int64, complete: Int64?)
    /// `bytes */complete`: no range was satisfiable; the current length is `complete`.
    case unsatisfied(complete: Int64)

    /// Parses a header value; returns nil for anything malformed or for a unit other than bytes.
    ///
    /// Follows the grammar strictly: a 206 whose range we cannot read exactly must not be combined
    /// with bytes already on disk.
    public init?(_ value: String) {
        var s = Substring(value)
        s = s.drop(while: { $0 == " " })
        guard s.count > 6, s.prefix(6).lowercased() == "bytes " else { return nil }
        s = s.dropFirst(6).drop(while: { $0 == " " })
        while s.last == " " { s = s.dropLast() }
        guard let slash = s.firstIndex(of: "/") else { return nil }
        let rangePart = s[..<slash]
        let lengthPart = s[s.index(after: slash)...]
        if rangePart == "*" {
            guard let complete = ContentRange.digits(lengthPart) else { return nil }
            self = .unsatisfied(complete: complete)
            return
        }
        guard let dash = rangePart.firstIndex(of: "-"),
            let first = ContentRange.digits(rangePart[..<dash]),
            let last = ContentRange.digits(rangePart[rangePart.index(after: dash)...]),
            first <= last
        else { return nil }
        var complete: Int64? = nil
        if lengthPart != "*" {
            guard let c = ContentRange.digits(lengthPart), last < c else { return nil }
            complete = c
        }
        self = .range(first: first, last: last, complete: complete)
    }

    /// The header value this range is written as.
    public var headerValue: String {
        switch self {
        case .range(let first, let last, let complete):
            return "bytes \(first)-\(last)/\(complete.map(String.init) ?? "*")"
        case .unsatisfied(let complete):
            return "bytes */\(complete)"
        }
    }

    static func digits(_ s: Substring) -> Int64? {
        guard !s.isEmpty, s.count <= 18, s.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        return Int64(s)
    }
}

/// A single `Range: bytes=first-[last]` request (RFC 9110 §14.1.2).
public struct ByteRange: Equatable, Sendable {
    /// First byte wanted (inclusive).
    public var first: Int64
    /// Last byte wanted (inclusive), or nil for "to the end".
    public var last: Int64?

    /// A range from `first` to `last` (inclusive), or to the end when `last` is nil.
    public init(first: Int64, last: Int64? = nil) {
        precondition(first >= 0 && (last ?? first) >= first)
        self.first = first
        self.last = last
    }

    /// The `Range` header value.
    public var headerValue: String {
        "bytes=\(first)-\(last.map(String.init) ?? "")"
    }
}
