import Foundation
import HTTPTypes

/// `-v`: the heads of requests and responses as text, secrets redacted (credentials, cookies and
/// anything named like a token or a key), and nothing a server sent that a terminal would act on.
public enum Trace {
    /// Header fields whose values are never shown: credentials and cookies, and fields named like a
    /// secret (a user's `-H "X-Api-Key: …"`).
    static func isSecret(_ name: String) -> Bool {
        let n = name.lowercased()
        return ["authorization", "proxy-authorization", "cookie", "set-cookie", "sig"].contains(n)
            || ["token", "secret", "key", "password", "passwd", "auth", "session", "credential", "signature"].contains { n.contains($0) }
    }

    /// A field as shown: its value redacted when secret, a URL's credentials removed, control
    /// characters (a terminal's escape sequences) replaced, and at most 300 characters.
    static func field(_ name: String, _ value: String) -> String {
        let shown: String
        if isSecret(name) {
            shown = "[redacted]"
        } else if name.lowercased() == "location" || name.lowercased() == "content-location" || name.lowercased() == "link" {
            shown = redactURLs(value)
        } else {
            shown = value
        }
        return printable(name, limit: 100) + ": " + printable(shown, limit: 300)
    }

    /// The URLs in a field's value without their credentials (a scheme-relative `//user:pass@host`
    /// too) and without the values of query parameters named like a secret.
    static func redactURLs(_ value: String) -> String {
        value.split(separator: " ", omittingEmptySubsequences: false).map { word in
            guard word.contains("://") || word.hasPrefix("//") || word.hasPrefix("<//") else { return String(word) }
            let trimmed = word.trimmingCharacters(in: CharacterSet(charactersIn: "<>;,\""))
            return word.replacingOccurrences(of: trimmed, with: url(trimmed))
        }.joined(separator: " ")
    }

    /// A URL as shown: no credentials, and the values of query parameters named like a secret
    /// (`X-Amz-Signature`, `sig`, `access_token`, `key`...) as `[redacted]`.
    static func url(_ text: String) -> String {
        let relative = text.hasPrefix("//")
        var shown = DownloadURL.redacted(relative ? "http:" + text : text)
        if relative, shown.hasPrefix("http:") { shown.removeFirst("http:".count) }
        guard let q = shown.firstIndex(of: "?") else { return shown }
        let end = shown[q...].firstIndex(of: "#") ?? shown.endIndex
        let query = shown[shown.index(after: q)..<end].split(separator: "&", omittingEmptySubsequences: false).map { pair -> String in
            guard let eq = pair.firstIndex(of: "=") else { return String(pair) }
            let name = pair[..<eq].removingPercentEncoding ?? String(pair[..<eq])
            return isSecret(name) ? pair[..<eq] + "=[redacted]" : String(pair)
        }.joined(separator: "&")
        return String(shown[...q]) + query + String(shown[end...])
    }

    /// `text` with every control character (a terminal's escape sequences) as `?`, cut at `limit` characters.
    public static func printable(_ text: String, limit: Int) -> String {
        var out = ""
        for (i, scalar) in text.unicodeScalars.enumerated() {
            if i == limit { out += "…"; break }
            switch scalar.value {
            case 0..<0x20, 0x7F, 0x80..<0xA0, 0x202A...0x202E, 0x2066...0x2069: out += "?"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// A request's head: `[n] > GET URL` and its fields.
    static func request(_ n: Int, url: String, fields: [(name: String, value: String)]) -> String {
        (["[\(n)] > GET " + printable(Self.url(url), limit: 2000)] + fields.prefix(100).map { "[\(n)] > " + field($0.name, $0.value) })
            .joined(separator: "\n")
    }

    /// A response's head: `[n] < STATUS` and its fields (the first 100).
    static func response(_ n: Int, _ head: ResponseHead) -> String {
        (["[\(n)] < \(head.status)"] + head.fields.prefix(100).map { "[\(n)] < " + field($0.name.rawName, $0.value) })
            .joined(separator: "\n")
    }
}

/// Passes a response on to its sink, having shown its head.
final class TracingSink<Base: ResponseSink>: ResponseSink {
    let base: Base
    let number: Int
    let trace: @Sendable (String) -> Void

    init(_ base: Base, number: Int, trace: @escaping @Sendable (String) -> Void) {
        self.base = base
        self.number = number
        self.trace = trace
    }

    func receiveHead(_ head: ResponseHead) throws {
        trace(Trace.response(number, head))
        try base.receiveHead(head)
    }

    func receiveBody(_ bytes: UnsafeRawBufferPointer) throws -> Double {
        try base.receiveBody(bytes)
    }
}
