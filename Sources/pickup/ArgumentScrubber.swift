import Foundation

/// Hides secrets from `ps` and `/proc/PID/cmdline`: once the command line is parsed, the values
/// of `-u`/`--user`, `-b`/`--cookie`, `-H`/`--header` (the value, not the name), the user
/// information of `--proxy` and of every URL are overwritten in the process's own argument
/// strings, as curl does. Linux and macOS read a process's arguments from its memory, so the
/// overwritten bytes are what they show; a reader that looked in the first milliseconds, before
/// the parse, could still have seen them (say so in the README).
enum ArgumentScrubber {
    /// Options whose whole value is secret.
    static let secretValues: Set<String> = ["-u", "--user", "-b", "--cookie"]
    /// Options of the form `Name: value`, whose value is hidden.
    static let headerValues: Set<String> = ["-H", "--header"]
    /// Options that take a URL whose user information is hidden.
    static let urlValues: Set<String> = ["--proxy"]

    static func scrub() {
        let argc = Int(CommandLine.argc)
        let argv = CommandLine.unsafeArgv
        var i = 1
        while i < argc {
            guard let p = argv[i] else {
                i += 1
                continue
            }
            let arg = String(cString: p)
            let option: String
            let value: UnsafeMutablePointer<CChar>
            var skip = 1
            if let eq = arg.utf8.firstIndex(of: UInt8(ascii: "=")), arg.hasPrefix("--") {
                option = String(arg[..<eq])
                value = p + arg.utf8.distance(from: arg.utf8.startIndex, to: eq) + 1
            } else if arg.count > 2, !arg.hasPrefix("--"), arg.hasPrefix("-"), ["-u", "-b", "-H"].contains(String(arg.prefix(2))) {
                option = String(arg.prefix(2))
                value = p + 2
            } else if i + 1 < argc, let next = argv[i + 1],
                secretValues.contains(arg) || headerValues.contains(arg) || urlValues.contains(arg) {
                option = arg
                value = next
                skip = 2
            } else {
                // A positional argument (a URL) or any other option's value: its user information.
                hideUserInfo(p)
                i += 1
                continue
            }
            if secretValues.contains(option) {
                fill(value, from: 0)
            } else if headerValues.contains(option) {
                // `Name: value`: the name stays.
                let text = String(cString: value)
                if let colon = text.utf8.firstIndex(of: UInt8(ascii: ":")) {
                    fill(value, from: text.utf8.distance(from: text.utf8.startIndex, to: colon) + 1)
                } else {
                    fill(value, from: 0)
                }
            } else if urlValues.contains(option) {
                hideUserInfo(value)
            } else {
                // `--other=value`: its user information, as for a positional argument.
                hideUserInfo(p)
            }
            i += skip
        }
    }

    /// Overwrites the C string at `p` with `*` from byte `offset` on (its length stays).
    static func fill(_ p: UnsafeMutablePointer<CChar>, from offset: Int) {
        let n = strlen(p)
        guard offset < n else { return }
        for k in offset..<n { p[k] = CChar(UInt8(ascii: "*")) }
    }

    /// In `scheme://user:password@host...`, overwrites `user:password` with `*`.
    static func hideUserInfo(_ p: UnsafeMutablePointer<CChar>) {
        let n = strlen(p)
        var k = 0
        // "://"
        while k + 2 < n, !(p[k] == 0x3A && p[k + 1] == 0x2F && p[k + 2] == 0x2F) { k += 1 }
        guard k + 2 < n else { return }
        let start = k + 3
        var end = start
        // The authority ends at '/', '?' or '#'; user information ends at its last '@'.
        var at: Int? = nil
        while end < n, p[end] != 0x2F, p[end] != 0x3F, p[end] != 0x23 {
            if p[end] == 0x40 { at = end }
            end += 1
        }
        guard let at, at > start else { return }
        for j in start..<at { p[j] = CChar(UInt8(ascii: "*")) }
    }
}
