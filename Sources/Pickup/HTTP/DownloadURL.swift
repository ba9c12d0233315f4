import Foundation

/// Checks URLs before they reach the HTTP stack, and hides their credentials when shown.
///
/// Every URL the engine requests (the user's, each redirect target, each restored download)
/// passes ``check(_:)`` first: AsyncHTTPClient takes the host and port from Foundation's `URL` and
/// traps on a port an IP address cannot have (`http://127.0.0.1:99999/`), so the same parse is
/// done here and anything it could not take is refused with a message.
public enum DownloadURL {
    /// The longest URL accepted, in bytes (servers commonly refuse request lines past 8 KiB).
    public static let maxLength = 8192

    /// The URL as it will be requested, or why it cannot be.
    /// - Throws: ``PickupError/invalidInput(_:)`` with a one-line reason (credentials redacted).
    @discardableResult
    public static func check(_ url: String) throws(PickupError) -> URL {
        let shown = redacted(url)
        guard url.utf8.count <= maxLength else {
            throw .invalidInput("the URL is longer than \(maxLength) bytes")
        }
        guard !url.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F }) else {
            throw .invalidInput("the URL has spaces or control characters: \(shown)")
        }
        guard let parsed = URL(string: url), let scheme = parsed.scheme?.lowercased(),
            ["http", "https", "ftp", "ftps"].contains(scheme), url.contains("://")
        else { throw .invalidInput("not an http, https or ftp URL: \(shown)") }
        guard let host = parsed.host, !host.isEmpty else { throw .invalidInput("the URL has no host: \(shown)") }
        guard portIsUsable(url, parsed: parsed) else { throw .invalidInput("the port is not one from 1 to 65535: \(shown)") }
        if host.utf8.count > 253 + 2 { throw .invalidInput("the host name is too long: \(shown)") }
        return parsed
    }

    /// Whether the port `url` names, if any, is 1 to 65535 and is the one Foundation's parse
    /// (`parsed`) gives. Foundation gives no port for one past Int's range
    /// (`:99999999999999999999`), and the request would then go to the default port: the port is
    /// read from the text too. `host:/` (an empty port) is the default port (RFC 3986 §3.2.3).
    static func portIsUsable(_ url: String, parsed: URL) -> Bool {
        guard let text = portText(url), !text.isEmpty else { return true }
        let digits = text.drop(while: { $0 == UInt8(ascii: "0") })
        guard text.allSatisfy({ (0x30...0x39).contains($0) }), digits.count <= 5,
            let port = Int(String(decoding: digits, as: UTF8.self))
        else { return false }
        return (1...65535).contains(port) && parsed.port == port
    }

    /// The text after the authority's port colon (without user information; after an IPv6
    /// literal's `]`), or nil when the authority names no port.
    static func portText(_ url: String) -> ArraySlice<UInt8>? {
        let bytes = Array(url.utf8)
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")), bytes[colon...].starts(with: Array("://".utf8)) else { return nil }
        let start = colon + 3
        let end = bytes[start...].firstIndex(where: { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") })
            ?? bytes.endIndex
        var hostStart = start
        if let at = bytes[start..<end].lastIndex(of: UInt8(ascii: "@")) { hostStart = at + 1 }
        if hostStart < end, bytes[hostStart] == UInt8(ascii: "[") {
            guard let close = bytes[hostStart..<end].firstIndex(of: UInt8(ascii: "]")) else { return nil }
            hostStart = close
        }
        guard let portColon = bytes[hostStart..<end].lastIndex(of: UInt8(ascii: ":")) else { return nil }
        return bytes[(portColon + 1)..<end]
    }

    /// Whether `host` (without brackets) is an IP address literal (IPv4 dotted, or IPv6): no
    /// domain cookies for it, and no name for TLS to check (the address is checked instead).
    static func isIPAddress(_ host: String) -> Bool {
        host.contains(":") || (!host.isEmpty && host.allSatisfy { $0 == "." || ($0.isASCII && $0.isNumber) })
    }

    /// `url` with its user information replaced whole by `***` (`http://***@host/`), for messages,
    /// listings, events, logs and hooks: a user name can be a token (`https://ghp_TOKEN@host/`).
    /// Anything that is not a URL with user information comes back unchanged.
    public static func redacted(_ url: String) -> String {
        guard url.utf8.contains(UInt8(ascii: "@")), let schemeEnd = url.range(of: "://") else { return url }
        let authorityStart = schemeEnd.upperBound
        let authorityEnd = url[authorityStart...].firstIndex(where: { $0 == "/" || $0 == "?" || $0 == "#" }) ?? url.endIndex
        let authority = url[authorityStart..<authorityEnd]
        guard let at = authority.lastIndex(of: "@") else { return url }
        return String(url[..<authorityStart]) + "***" + String(url[at...])
    }
}
