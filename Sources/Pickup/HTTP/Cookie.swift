import Foundation

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

    /// Keeps in `jar` the cookies a response to `url` sets (its `Set-Cookie` values), for the rest of
    /// a run (along a redirect chain): each replaces the one of the same name, domain and path,
    /// an expired one only removes it, and the jar stays within the caps.
    static func keep(_ values: [String], from url: String, in jar: inout [Cookie], now: Int64) {
        guard !values.isEmpty, let u = URL(string: url) else { return }
        for value in values.prefix(maxPerDomain) {
            guard let c = parseSetCookie(value, from: u, now: now), c.name.utf8.count + c.value.utf8.count <= maxSize else { continue }
            jar.removeAll { $0.name == c.name && $0.domain == c.domain && $0.path == c.path }
            if (c.expires ?? .max) > now { jar.append(c) }
        }
        jar = capped(jar)
    }

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
