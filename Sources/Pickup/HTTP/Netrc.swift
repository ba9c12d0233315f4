import Foundation

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
