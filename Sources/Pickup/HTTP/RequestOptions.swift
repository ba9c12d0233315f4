import Foundation
import HTTPTypes

/// A header field the user adds to every request of a download.
public struct RequestHeader: Sendable, Codable, Equatable {
    /// The field name, e.g. `X-Token`.
    public var name: String
    /// The field value.
    public var value: String

    /// A header, checked: a token name, a value without control characters (CR, LF, NUL, ...), and none of the fields
    /// Pickup sets itself (`Range`, `If-Range`, `Accept-Encoding`, ...).
    /// - Throws: ``PickupError/invalidInput(_:)``.
    public init(name: String, value: String) throws(PickupError) {
        let tchar = Set("!#$%&'*+-.^_`|~".utf8)
        guard !name.isEmpty, name.utf8.count <= 256,
            name.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x7A) || tchar.contains($0) })
        else { throw .invalidInput("'\(name.prefix(40))' is not a header field name") }
        // RFC 9110 5.5: a value is visible characters, obs-text, spaces and tabs; no other control
        // byte (HTTPTypes would turn one into a space silently).
        guard value.utf8.count <= 16384, !value.utf8.contains(where: { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }) else {
            throw .invalidInput("the value of \(name) has a control character (a line break, NUL), or is too long")
        }
        if Self.reserved.contains(name.lowercased()) {
            throw .invalidInput("\(name) is set by pickup itself and cannot be given")
        }
        self.name = name
        self.value = value.trimmingCharacters(in: .whitespaces)
    }

    /// The field as sent; nil for a name that is not a token (the checking initialisers make
    /// none, but one decoded from a stored download is input like any other).
    var field: HTTPField? { HTTPField.Name(name).map { HTTPField(name: $0, value: value) } }

    /// Parses `Name: value` (curl's `-H`).
    /// - Throws: ``PickupError/invalidInput(_:)``.
    public init(line: String) throws(PickupError) {
        guard let colon = line.firstIndex(of: ":") else { throw .invalidInput("a header must be 'Name: value'") }
        try self.init(name: String(line[..<colon]).trimmingCharacters(in: .whitespaces),
                      value: String(line[line.index(after: colon)...]))
    }

    /// Fields Pickup sets (byte ranges, conditionals, framing): a user's value would break them.
    static let reserved: Set<String> = [
        "range", "if-range", "if-none-match", "if-modified-since", "accept-encoding", "host", "content-length",
        "transfer-encoding", "connection", "te", "upgrade", "expect",
    ]

    /// Whether the field carries a secret: sent only to the origin it was given for, never shown.
    public var isSecret: Bool { Self.secret.contains(name.lowercased()) }
    static let secret: Set<String> = ["authorization", "proxy-authorization", "cookie"]

    /// `Authorization: Basic` for `user:password`.
    public static func basic(user: String, password: String) -> RequestHeader {
        // Built directly: the name is fixed and base64 has no forbidden bytes.
        RequestHeader(unchecked: "Authorization", "Basic " + Data("\(user):\(password)".utf8).base64EncodedString())
    }

    init(unchecked name: String, _ value: String) {
        self.name = name
        self.value = value
    }
}

/// What a download sends beyond Pickup's own fields: the user's headers (`-H`, `-A`, `--referer`,
/// `-u` as `Authorization`) and cookies (`-b`, `--load-cookies`). Headers that carry secrets
/// (`Authorization`, `Proxy-Authorization`, `Cookie`) go only to the origin (scheme, host, port) of
/// the URL the user gave: a redirect elsewhere drops them (curl's CVE-2018-1000007, CVE-2022-27776).
public struct RequestOptions: Sendable, Codable, Equatable {
    /// Header fields, in order.
    public var headers: [RequestHeader]
    /// Cookies, sent where they match.
    public var cookies: [Cookie]

    /// Options.
    public init(headers: [RequestHeader] = [], cookies: [Cookie] = []) {
        self.headers = headers
        self.cookies = cookies
    }

    /// Whether there is nothing to send.
    public var isEmpty: Bool { headers.isEmpty && cookies.isEmpty }

    /// These options for a URL that a document fetched from `given` named (a Metalink answer's
    /// files): all of them where `url` has `given`'s origin, else none of the secret header
    /// fields (the user gave them for `given`); cookies stay, sent only where they match.
    public func named(by given: String, for url: String) -> RequestOptions {
        if let origin = Origin(url), origin == Origin(given) { return self }
        return RequestOptions(headers: headers.filter { !$0.isSecret }, cookies: cookies)
    }

    /// Header names, each secret value replaced by `***`: what listings and the API show.
    public var redacted: [RequestHeader] {
        headers.map { RequestHeader(unchecked: $0.name, $0.isSecret ? "***" : $0.value) }
    }

    /// The fields for a request to `url`: every header when `url` has the origin of `original`,
    /// else the ones without secrets; then the cookies of `jar` that match `url`.
    static func fields(for url: String, original: String, headers: [RequestHeader], jar: [Cookie], now: Int64) -> HTTPFields {
        guard let target = URL(string: url) else { return [:] }
        let sameOrigin = Origin(url) == Origin(original)
        var out = HTTPFields()
        for h in headers where sameOrigin || !h.isSecret { if let f = h.field { out.append(f) } }
        var cookie = ""
        for c in jar where c.matches(target, now: now) {
            let pair = "\(c.name)=\(c.value)"
            // The field stays within its size: the cookies past it are left out.
            guard cookie.utf8.count + pair.utf8.count + 2 <= Cookie.maxHeader else { break }
            cookie += cookie.isEmpty ? pair : "; " + pair
        }
        if !cookie.isEmpty { out.append(HTTPField(name: .cookie, value: cookie)) }
        return out
    }

    /// Whether a download of `url` with these options sends a secret: a secret header field, a
    /// cookie, or credentials in the URL.
    public func carriesSecrets(url: String) -> Bool {
        headers.contains { $0.isSecret } || !cookies.isEmpty || Self.credentials(in: url) != nil
    }

    /// The user's header fields for requests to `url`, with Basic credentials from its user
    /// information when no Authorization field is given.
    static func userHeaders(_ headers: [RequestHeader], for url: String) -> [RequestHeader] {
        guard !headers.contains(where: { $0.field?.name == .authorization }), let basic = credentials(in: url) else {
            return headers
        }
        return headers + [basic]
    }

    /// The credentials of a URL's user information (`http://user:password@host/`), as Basic.
    public static func credentials(in url: String) -> RequestHeader? {
        guard let u = URL(string: url), let user = u.user(percentEncoded: false), !user.isEmpty else { return nil }
        return .basic(user: user, password: u.password(percentEncoded: false) ?? "")
    }
}
