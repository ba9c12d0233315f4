import Foundation

/// A header field the user adds to every request of a download.
public struct RequestHeader: Sendable, Codable, Equatable {
    /// The field name, e.g. `X-Token`.
    public var name: String
    /// The field value.
    public var value: String

    /// A header, checked: a token name, a value without CR, LF or NUL, and none of the fields
    /// Pickup sets itself (`Range`, `If-Range`, `Accept-Encoding`, ...).
    /// - Throws: ``PickupError/invalidInput(_:)``.
    public init(name: String, value: String) throws(PickupError) {
        let tchar = Set("!#$%&'*+-.^_`|~".utf8)
        guard !name.isEmpty, name.utf8.count <= 256,
            name.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x7A) || tchar.contains($0) })
        else { throw .invalidInput("'\(name.prefix(40))' is not a header field name") }
        guard value.utf8.count <= 16384, !value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) else {
            throw .invalidInput("the value of \(name) has a line break or NUL, or is too long")
        }
        if Self.reserved.contains(name.lowercased()) {
            throw .invalidInput("\(name) is set by pickup itself and cannot be given")
        }
        self.name = name
        self.value = value.trimmingCharacters(in: .whitespaces)
    }

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

/// A cookie (RFC 6265), from `-b`, a cookies.txt file, or a `Set-Cookie` along a redirect chain.
public struct Cookie: Sendable, Codable, Equatable {
    public var name: String
    public var value: String
    /// The domain, lower-cased, without a leading dot.
    public var domain: String
    /// Sent to that host only (no `Domain` attribute), else to its subdomains too.
    public var hostOnly: Bool
    public var path: String
    public var secure: Bool
    /// Seconds since the epoch; nil for a session cookie.
    public var expires: Int64?
    /// For a cookie the user gave for one URL (`-b`): the only origin it goes to
    /// (`scheme://host:port`), as for `Authorization`; nil for cookies matched by RFC 6265 alone
    /// (set by servers, or from a cookies.txt jar).
    public var origin: String?

    /// A cookie.
    public init(name: String, value: String, domain: String, hostOnly: Bool, path: String = "/", secure: Bool = false,
                expires: Int64? = nil) {
        self.name = name
        self.value = value
        self.domain = domain.lowercased().drop(while: { $0 == "." }).description
        self.hostOnly = hostOnly
        self.path = path.isEmpty ? "/" : path
        self.secure = secure
        self.expires = expires
    }

    /// Whether it goes with a request to `url` at `now` (domain, path, secure flag, expiry).
    public func matches(_ url: URL, now: Int64) -> Bool {
        guard let host = url.host?.lowercased() else { return false }
        if let origin, Origin(url.absoluteString)?.description != origin { return false }
        if let expires, expires <= now { return false }
        if secure, url.scheme?.lowercased() != "https" { return false }
        let domainOK = hostOnly || DownloadURL.isIPAddress(host) ? host == domain : (host == domain || host.hasSuffix("." + domain))
        guard domainOK else { return false }
        let path = url.path.isEmpty ? "/" : url.path
        return path == self.path || (path.hasPrefix(self.path) && (self.path.hasSuffix("/") || path.dropFirst(self.path.count).first == "/"))
    }

    /// Cookies kept per domain and in all (RFC 6265 §6.1 asks for at least 50 and 3,000; a
    /// download needs far fewer), the size of one (name and value, §6.1: 4,096) and of the
    /// `Cookie` field sent: what a server setting thousands of cookies can make Pickup hold and send.
    static let maxPerDomain = 50
    static let maxTotal = 300
    static let maxSize = 4096
    static let maxHeader = 8192

    /// `jar` within the caps, the newest of each domain kept (they come last).
    static func capped(_ jar: [Cookie]) -> [Cookie] {
        var perDomain: [String: Int] = [:]
        var kept: [Cookie] = []
        for c in jar.reversed() {
            perDomain[c.domain, default: 0] += 1
            if perDomain[c.domain]! <= maxPerDomain, kept.count < maxTotal { kept.append(c) }
        }
        return kept.reversed()
    }

    /// `a=b; c=d` (curl's `-b`), for `host`; with `origin`, for that origin only.
    public static func parseHeader(_ text: String, host: String, origin: String? = nil) -> [Cookie] {
        text.split(separator: ";").compactMap { pair in
            guard let eq = pair.firstIndex(of: "=") else { return nil }
            let name = pair[..<eq].trimmingCharacters(in: .whitespaces)
            guard !name.isEmpty else { return nil }
            var cookie = Cookie(name: name, value: pair[pair.index(after: eq)...].trimmingCharacters(in: .whitespaces),
                                domain: host, hostOnly: true)
            cookie.origin = origin
            return cookie
        }
    }

    /// `a=b; c=d` given for `url`: sent to its origin only (scheme, host and port).
    public static func parseHeader(_ text: String, for url: String) -> [Cookie] {
        guard let origin = Origin(url), let host = URL(string: url)?.host else { return [] }
        return parseHeader(text, host: host, origin: origin.description)
    }

    /// The Netscape cookies.txt format that browsers' extensions export (and curl and wget read):
    /// `domain, include-subdomains, path, secure, expiry, name, value` separated by tabs; `#`
    /// comments, and `#HttpOnly_` before the domain of an HttpOnly cookie.
    /// - Throws: ``PickupError/invalidInput(_:)`` naming the first malformed line.
    public static func parseNetscape(_ text: String) throws(PickupError) -> [Cookie] {
        var cookies: [Cookie] = []
        for (n, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            var line = Substring(raw.hasSuffix("\r") ? raw.dropLast() : raw)
            if line.hasPrefix("#HttpOnly_") { line = line.dropFirst("#HttpOnly_".count) }
            if line.isEmpty || line.hasPrefix("#") { continue }
            let f = line.split(separator: "\t", omittingEmptySubsequences: false)
            guard f.count >= 7, let expiry = Int64(f[4]) else {
                throw .invalidInput("cookies file line \(n + 1): expected 7 tab-separated fields")
            }
            cookies.append(Cookie(name: String(f[5]), value: String(f[6...].joined(separator: "\t")), domain: String(f[0]),
                                  hostOnly: f[1].uppercased() != "TRUE", path: String(f[2]),
                                  secure: f[3].uppercased() == "TRUE", expires: expiry == 0 ? nil : expiry))
        }
        return cookies
    }

    /// A `Set-Cookie` field from a response to `url` (RFC 6265 §5.2: `Domain`, `Path`, `Secure`,
    /// `Max-Age`, `Expires`); nil when malformed or for a domain `url` may not set.
    public static func parseSetCookie(_ field: String, from url: URL, now: Int64) -> Cookie? {
        guard let host = url.host?.lowercased() else { return nil }
        var parts = field.split(separator: ";").makeIterator()
        guard let first = parts.next(), let eq = first.firstIndex(of: "=") else { return nil }
        let name = first[..<eq].trimmingCharacters(in: .whitespaces)
        guard !name.isEmpty else { return nil }
        var cookie = Cookie(name: name, value: first[first.index(after: eq)...].trimmingCharacters(in: .whitespaces),
                            domain: host, hostOnly: true)
        var dir = url.path
        if let slash = dir.lastIndex(of: "/"), slash != dir.startIndex { dir = String(dir[..<slash]) } else { dir = "/" }
        cookie.path = dir
        while let attribute = parts.next() {
            let kv = attribute.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                .map { $0.trimmingCharacters(in: .whitespaces) }
            guard let key = kv.first else { continue }
            switch key.lowercased() {
            case "domain" where kv.count == 2 && !kv[1].isEmpty:
                let d = kv[1].lowercased().drop(while: { $0 == "." }).description
                // An IP address domain-matches only itself (RFC 6265 §5.1.3): no domain cookies for it.
                guard host == d || (!DownloadURL.isIPAddress(host) && host.hasSuffix("." + d) && d.contains(".")) else { return nil }
                cookie.domain = d
                cookie.hostOnly = false
            case "path" where kv.count == 2 && kv[1].hasPrefix("/"):
                cookie.path = kv[1]
            case "secure":
                cookie.secure = true
            case "max-age" where kv.count == 2:
                if let s = Int64(kv[1]) { cookie.expires = s <= 0 ? 0 : (s > Int64.max - max(now, 0) ? Int64.max : max(now, 0) + s) }
            case "expires" where kv.count == 2 && cookie.expires == nil:
                cookie.expires = HTTPDate.parse(kv[1])
            default:
                break
            }
        }
        return cookie
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
    static func fields(for url: String, original: String, headers: [RequestHeader], jar: [Cookie], now: Int64)
        -> [(name: String, value: String)]
    {
        guard let target = URL(string: url) else { return [] }
        let sameOrigin = Origin(url) == Origin(original)
        var out: [(name: String, value: String)] = []
        for h in headers where sameOrigin || !h.isSecret { out.append((h.name, h.value)) }
        var cookie = ""
        for c in jar where c.matches(target, now: now) {
            let pair = "\(c.name)=\(c.value)"
            // The field stays within its size: the cookies past it are left out.
            guard cookie.utf8.count + pair.utf8.count + 2 <= Cookie.maxHeader else { break }
            cookie += cookie.isEmpty ? pair : "; " + pair
        }
        if !cookie.isEmpty { out.append(("Cookie", cookie)) }
        return out
    }

    /// Whether a download of `url` with these options sends a secret: a secret header field, a
    /// cookie, or credentials in the URL.
    public func carriesSecrets(url: String) -> Bool {
        headers.contains { $0.isSecret } || !cookies.isEmpty || Self.credentials(in: url) != nil
    }

    /// The credentials of a URL's user information (`http://user:password@host/`), as Basic.
    public static func credentials(in url: String) -> RequestHeader? {
        guard let u = URL(string: url), let user = u.user(percentEncoded: false), !user.isEmpty else { return nil }
        return .basic(user: user, password: u.password(percentEncoded: false) ?? "")
    }
}

/// A `.netrc` file (curl's `--netrc`): `machine HOST login USER password PASS` entries and a
/// `default` entry; tokens separated by any white space, `#` comments.
public struct Netrc: Sendable, Equatable {
    struct Entry: Sendable, Equatable {
        var login: String?
        var password: String?
    }
    var machines: [String: Entry] = [:]
    var fallback: Entry?

    /// Parses the text of a netrc file.
    public init(parsing text: String) {
        let tokens = text.split(separator: "\n").map { line -> Substring in
            line.hasPrefix("#") ? "" : line
        }.joined(separator: "\n").split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }).map(String.init)
        var i = 0
        var current: String?? = nil  // .some(host) for a machine, .some(nil) for default
        while i < tokens.count {
            let t = tokens[i]
            switch t {
            case "machine" where i + 1 < tokens.count:
                current = .some(tokens[i + 1].lowercased())
                machines[tokens[i + 1].lowercased()] = machines[tokens[i + 1].lowercased()] ?? Entry()
                i += 2
            case "default":
                current = .some(nil)
                fallback = fallback ?? Entry()
                i += 1
            case "login", "password", "account", "macdef":
                guard i + 1 < tokens.count, let target = current else { i += 1; continue }
                let value = tokens[i + 1]
                if let host = target {
                    if t == "login" { machines[host]?.login = value }
                    if t == "password" { machines[host]?.password = value }
                } else {
                    if t == "login" { fallback?.login = value }
                    if t == "password" { fallback?.password = value }
                }
                i += 2
            default:
                i += 1
            }
        }
    }

    /// `Authorization: Basic` for `url`'s host (or the default entry), when the file has a login for it.
    public func credentials(for url: String) -> RequestHeader? {
        guard let host = URL(string: url)?.host?.lowercased(),
            let entry = machines[host] ?? fallback, let login = entry.login
        else { return nil }
        return .basic(user: login, password: entry.password ?? "")
    }
}

/// Scheme, host and port: what a secret is bound to.
struct Origin: Equatable, CustomStringConvertible {
    let scheme: String
    let host: String
    let port: Int

    var description: String { "\(scheme)://\(host):\(port)" }

    init?(_ url: String) {
        guard let u = URL(string: url), let scheme = u.scheme?.lowercased(), let host = u.host?.lowercased() else { return nil }
        self.scheme = scheme
        self.host = host
        port = u.port ?? Self.defaultPort(scheme)
    }

    /// The port a URL of this scheme means when it names none: a credential given for
    /// `ftp://host/` is bound to port 21, not to whatever else listens on the host.
    static func defaultPort(_ scheme: String) -> Int {
        switch scheme {
        case "https": 443
        case "ftp", "ftps": 21  // ftps:// is explicit TLS (AUTH TLS), on FTP's own port
        default: 80
        }
    }
}
