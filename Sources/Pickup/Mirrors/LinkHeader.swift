import Foundation

/// `Link` header fields (RFC 8288) as Metalink/HTTP (RFC 6249) uses them: `rel=duplicate` names a
/// mirror of the same file (`pri` its priority, lower first), `rel=describedby` with
/// `type="application/metalink4+xml"` a Metalink document. Parsed without trapping whatever a
/// server sends (fuzzed); targets that are not absolute http, https or ftp URLs are left out.
public enum LinkHeader {
    public struct Link: Sendable, Equatable {
        public var target: String
        public var relations: [String]
        public var parameters: [String: String]
    }

    /// At most this many links are read from a response (a server could send thousands).
    public static let maxLinks = 100

    /// Every link in `values` (the field's values, one per header line).
    public static func links(_ values: [String]) -> [Link] {
        var links: [Link] = []
        for value in values {
            var rest = Substring(value)
            while links.count < maxLinks, let open = rest.firstIndex(of: "<") {
                guard let close = rest[open...].firstIndex(of: ">") else { break }
                let target = String(rest[rest.index(after: open)..<close]).trimmingCharacters(in: .whitespaces)
                rest = rest[rest.index(after: close)...]
                let (parameters, after) = Self.parameters(rest)
                rest = after
                let relations = (parameters["rel"] ?? "").lowercased().split(separator: " ").map(String.init)
                links.append(Link(target: target, relations: relations, parameters: parameters))
            }
        }
        return links
    }

    /// The mirrors a response names (`rel=duplicate`), by priority then as written.
    public static func duplicates(_ values: [String]) -> [Metalink.Mirror] {
        Metalink.Mirror.byPriority(links(values).compactMap { link in
            guard link.relations.contains("duplicate"), (try? DownloadURL.check(link.target)) != nil else { return nil }
            return Metalink.Mirror(url: link.target, priority: Metalink.Mirror.priority(link.parameters["pri"]), location: link.parameters["geo"])
        })
    }

    /// The Metalink document a response points to (`rel=describedby; type="application/metalink4+xml"`).
    public static func metalink(_ values: [String]) -> String? {
        links(values).first { link in
            link.relations.contains("describedby") && link.parameters["type"]?.lowercased() == Metalink.mediaType
                && (try? DownloadURL.check(link.target)) != nil
        }?.target
    }

    /// `; name=value; name="quoted, value"` up to the `,` that ends the link (or the end).
    static func parameters(_ text: Substring) -> ([String: String], Substring) {
        var parameters: [String: String] = [:]
        var rest = text
        while true {
            rest = rest.drop { $0 == " " || $0 == "\t" }
            guard let first = rest.first else { return (parameters, rest) }
            if first == "," { return (parameters, rest.dropFirst()) }
            guard first == ";" else {
                // Not a parameter: skip to the next link.
                guard let comma = rest.firstIndex(of: ",") else { return (parameters, rest[rest.endIndex...]) }
                return (parameters, rest[rest.index(after: comma)...])
            }
            rest = rest.dropFirst().drop { $0 == " " || $0 == "\t" }
            let name = rest.prefix { $0 != "=" && $0 != ";" && $0 != "," && $0 != " " }
            rest = rest[name.endIndex...].drop { $0 == " " || $0 == "\t" }
            var value = ""
            if rest.first == "=" {
                rest = rest.dropFirst().drop { $0 == " " || $0 == "\t" }
                if rest.first == "\"" {
                    rest = rest.dropFirst()
                    var escaped = false
                    var end = rest.endIndex
                    for i in rest.indices {
                        let c = rest[i]
                        if escaped { escaped = false; value.append(c); continue }
                        if c == "\\" { escaped = true; continue }
                        if c == "\"" { end = i; break }
                        value.append(c)
                    }
                    rest = end < rest.endIndex ? rest[rest.index(after: end)...] : rest[rest.endIndex...]
                } else {
                    let token = rest.prefix { $0 != ";" && $0 != "," && $0 != " " && $0 != "\t" }
                    value = String(token)
                    rest = rest[token.endIndex...]
                }
            }
            let key = name.lowercased()
            if !key.isEmpty, parameters[key] == nil, parameters.count < 32 { parameters[key] = value }
        }
    }
}
