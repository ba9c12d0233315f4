import ArgumentParser
import Foundation
import Pickup

/// What a download sends beyond an anonymous GET: headers, a user agent and referer, Basic
/// credentials and cookies (curl's and aria2's names).
struct RequestFlags: ParsableArguments {
    @Option(name: [.customShort("H"), .customLong("header")], help: ArgumentHelp(
        "Send this header with every request, e.g. \"Authorization: Bearer TOKEN\" (repeatable). "
            + "Authorization and Cookie go only to the URL's own origin.", valueName: "name: value"))
    var headers: [String] = []

    @Option(name: [.customShort("A"), .customLong("user-agent")], help: ArgumentHelp("The User-Agent to send.", valueName: "text"))
    var userAgent: String?

    @Option(help: ArgumentHelp("The Referer to send.", valueName: "url"))
    var referer: String?

    @Option(name: [.customShort("u"), .customLong("user")], help: ArgumentHelp(
        "HTTP Basic credentials, sent only to the URL's own origin (credentials in the URL work too).",
        valueName: "user:password"))
    var user: String?

    @Flag(help: "Take credentials for the URL's host from ~/.netrc (curl's --netrc).")
    var netrc = false

    @Option(help: ArgumentHelp("Take credentials for the URL's host from this netrc file.", valueName: "file"))
    var netrcFile: String?

    @Option(name: [.customShort("b"), .customLong("cookie")], help: ArgumentHelp(
        "Cookies to send to the URL's host, \"a=b; c=d\".", valueName: "cookies"))
    var cookie: String?

    @Option(help: ArgumentHelp(
        "Load cookies from a Netscape cookies.txt file (as browser extensions export), matched by domain, path, secure flag and expiry.",
        valueName: "file"))
    var loadCookies: String?

    func validate() throws {
        guard !Validation.skipped else { return }
        _ = try options(for: "http://localhost/")
    }

    /// The options for a download of `url`.
    func options(for url: String) throws -> RequestOptions {
        do throws(PickupError) {
            var o = RequestOptions(headers: try headers.map { line throws(PickupError) in try RequestHeader(line: line) })
            if let userAgent { o.headers.append(try RequestHeader(name: "User-Agent", value: userAgent)) }
            if let referer { o.headers.append(try RequestHeader(name: "Referer", value: referer)) }
            if let user {
                let (name, password) = user.firstIndex(of: ":").map { (String(user[..<$0]), String(user[user.index(after: $0)...])) }
                    ?? (user, "")
                o.headers.removeAll { $0.name.lowercased() == "authorization" }
                o.headers.append(.basic(user: name, password: password))
            }
            let hasCredentials = user != nil || RequestOptions.credentials(in: url) != nil
                || o.headers.contains { $0.name.lowercased() == "authorization" }
            if !hasCredentials, netrc || netrcFile != nil {
                let path = netrcFile ?? (NSHomeDirectory() + "/.netrc")
                guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
                    throw PickupError.invalidInput("cannot read the netrc file \(path)")
                }
                if let basic = Netrc(parsing: text).credentials(for: url) { o.headers.append(basic) }
            }
            if let cookie { o.cookies += Cookie.parseHeader(cookie, for: url) }
            if let loadCookies {
                guard let text = try? String(contentsOfFile: loadCookies, encoding: .utf8) else {
                    throw PickupError.invalidInput("cannot read the cookies file \(loadCookies)")
                }
                o.cookies += try Cookie.parseNetscape(text)
            }
            return o
        } catch {
            throw ValidationError(error.description)
        }
    }
}
