import Foundation

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
