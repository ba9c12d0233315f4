import Foundation

/// A proxy: `http://[user:password@]host:port` (absolute form for http and ftp URLs, CONNECT for
/// https ones: ``ProxyTransport``), or `socks5://host:port` and `socks5h://host:port`. For http and
/// https both SOCKS forms send the host name (AsyncHTTPClient's SOCKS client resolves nothing); for
/// ftp and ftps (``FTPTransport``) `socks5h` sends the name and `socks5` sends the address the name
/// resolves to here.
public struct ProxyURL: Sendable, Hashable, CustomStringConvertible {
    public enum Kind: String, Sendable, Hashable { case http, socks5 }
    public var kind: Kind
    public var host: String
    public var port: Int
    public var user: String?
    public var password: String?
    /// `socks5h://`: the proxy resolves the names (for FTP; see the type's note).
    public var resolvesAtProxy: Bool

    /// Parses a proxy URL (a bare `host:port` is an HTTP proxy, as curl takes it).
    /// - Throws: ``PickupError/invalidInput(_:)``.
    public init(parsing text: String) throws(PickupError) {
        let withScheme = text.contains("://") ? text : "http://" + text
        // Strictly `scheme://[user[:password]@]host[:port][/]`: nothing else may follow (a typo
        // such as `http//u:pw@host` would otherwise be a proxy named `http`).
        guard let u = URL(string: withScheme), let scheme = u.scheme?.lowercased(), let host = u.host, !host.isEmpty,
            u.path.isEmpty || u.path == "/", u.query == nil, u.fragment == nil,
            !text.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F })
        else {
            throw .invalidInput("not a proxy URL: \(Self.redacted(text))")
        }
        switch scheme {
        case "http": kind = .http
        case "socks5", "socks5h": kind = .socks5
        default: throw .invalidInput("proxy scheme \(scheme) is not supported (http, socks5, socks5h)")
        }
        guard DownloadURL.portIsUsable(withScheme, parsed: u) else {
            throw .invalidInput("the proxy's port is not one from 1 to 65535: \(Self.redacted(text))")
        }
        resolvesAtProxy = scheme != "socks5"
        self.host = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
        self.port = u.port ?? (kind == .http ? 3128 : 1080)
        user = u.user(percentEncoded: false)
        password = u.password(percentEncoded: false)
        if kind == .socks5, user != nil {
            throw .invalidInput("a SOCKS proxy with a user name and password is not supported")
        }
    }

    /// `scheme://host:port`, credentials left out.
    public var description: String { "\(kind == .socks5 && resolvesAtProxy ? "socks5h" : kind.rawValue)://\(host):\(port)" }

    /// A proxy setting as text, its user information hidden in every form (`user:pw@host:port`
    /// included, which has no scheme).
    public static func redacted(_ text: String) -> String {
        text.contains("://") ? DownloadURL.redacted(text) : String(DownloadURL.redacted("http://" + text).dropFirst(7))
    }
}

/// Which proxy each request goes through: curl's rules. `--proxy` for every URL, else the
/// environment's `http_proxy` (lower case only: `HTTP_PROXY` can be set by a CGI client),
/// `https_proxy`/`HTTPS_PROXY`, `ftp_proxy`/`FTP_PROXY` (for ftp and ftps), then
/// `all_proxy`/`ALL_PROXY`; an ftp or ftps URL with no proxy of its own takes the http one (a
/// proxy the user set is never bypassed for lack of an FTP-specific one); hosts in `--noproxy` or
/// `no_proxy`/`NO_PROXY` (comma-separated; a name matches itself and its subdomains; `*` matches
/// every host) go direct.
public struct ProxyRules: Sendable, Equatable {
    /// For http URLs.
    public var http: ProxyURL?
    /// For https URLs.
    public var https: ProxyURL?
    /// For ftp and ftps URLs (nil: the http one).
    public var ftp: ProxyURL?
    /// Hosts that go direct.
    public var noProxy: [String]
    /// Through an HTTP proxy, `http://` URLs go through a CONNECT tunnel too (curl's
    /// `--proxytunnel`) instead of in absolute form.
    public var tunnel: Bool

    /// No proxy at all.
    public init(http: ProxyURL? = nil, https: ProxyURL? = nil, ftp: ProxyURL? = nil, noProxy: [String] = [], tunnel: Bool = false) {
        self.http = http
        self.https = https
        self.ftp = ftp
        self.noProxy = noProxy
        self.tunnel = tunnel
    }

    /// The rules from `--proxy` and `--noproxy` (an empty `--proxy` turns proxies off) and, where
    /// they say nothing, the environment.
    /// - Throws: ``PickupError/invalidInput(_:)`` for a malformed proxy URL.
    public static func resolve(proxy: String?, noProxy: String?, tunnel: Bool = false, environment env: [String: String]) throws(PickupError) -> ProxyRules {
        func value(_ names: String...) -> String? { names.lazy.compactMap { env[$0] }.first { !$0.isEmpty } }
        let skip = (noProxy ?? value("no_proxy", "NO_PROXY") ?? "").split(separator: ",").map {
            $0.trimmingCharacters(in: .whitespaces).lowercased()
        }.filter { !$0.isEmpty }
        if let proxy {
            if proxy.isEmpty { return ProxyRules() }
            let p = try ProxyURL(parsing: proxy)
            return ProxyRules(http: p, https: p, ftp: p, noProxy: skip, tunnel: tunnel)
        }
        let all = try value("all_proxy", "ALL_PROXY").map { text throws(PickupError) in try ProxyURL(parsing: text) }
        let http = try value("http_proxy").map { text throws(PickupError) in try ProxyURL(parsing: text) } ?? all
        let https = try value("https_proxy", "HTTPS_PROXY").map { text throws(PickupError) in try ProxyURL(parsing: text) } ?? all
        let ftp = try value("ftp_proxy", "FTP_PROXY").map { text throws(PickupError) in try ProxyURL(parsing: text) } ?? all
        return ProxyRules(http: http, https: https, ftp: ftp, noProxy: skip, tunnel: tunnel)
    }

    /// The proxy for a request to `url`, nil to go direct.
    public func proxy(for url: String) -> ProxyURL? {
        guard http != nil || https != nil || ftp != nil, let u = URL(string: url), let host = u.host?.lowercased() else { return nil }
        let bare = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
        for entry in noProxy {
            if entry == "*" { return nil }
            var name = entry.hasPrefix(".") ? String(entry.dropFirst()) : entry
            if let colon = name.lastIndex(of: ":"), !name.contains("]"), name.filter({ $0 == ":" }).count == 1 {
                name = String(name[..<colon])
            }
            name = name.hasPrefix("[") ? String(name.dropFirst().dropLast()) : name
            if bare == name || bare.hasSuffix("." + name) { return nil }
        }
        switch u.scheme?.lowercased() {
        case "https": return https
        case "ftp", "ftps": return ftp ?? http
        default: return http
        }
    }

    /// Every proxy the rules may pick.
    var all: Set<ProxyURL> { Set([http, https, ftp].compactMap { $0 }) }
}
