import Foundation

/// Hides secrets from `ps` and `/proc/PID/cmdline`: once the command line is parsed, the values
/// of `-u`/`--user`, `-b`/`--cookie`, `-H`/`--header` (the value, not the name; also grouped
/// after other short options, `-qu`), the user information of `--proxy` (with or without a
/// scheme) and of every URL are overwritten in the process's own argument
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
            } else if let (letter, offset) = groupedSecret(arg) {
                // `-u VALUE`, `-uVALUE`, and short options grouped before it (`-qu VALUE`, `-qH 'A: b'`).
                option = "-" + String(letter)
                if offset < arg.utf8.count {
                    value = p + offset
                } else if i + 1 < argc, let next = argv[i + 1] {
                    value = next
                    skip = 2
                } else {
                    i += 1
                    continue
                }
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
                // A proxy may be written without a scheme (`user:password@host:port`).
                hideUserInfo(value, schemeOptional: true)
            } else {
                // `--other=value`: its user information, as for a positional argument.
                hideUserInfo(p)
            }
            i += skip
        }
    }

    /// Short options whose value is secret, as letters.
    static let secretLetters: Set<Character> = ["u", "b", "H"]

    /// In a group of short options (`-qu`, `-quVALUE`), the first secret option's letter and the
    /// byte offset where its joined value would start; nil when the argument has none. Letters of
    /// other options before it are taken as flags: at worst another option's joined value is
    /// hidden too, which costs nothing.
    static func groupedSecret(_ arg: String) -> (Character, Int)? {
        guard arg.hasPrefix("-"), !arg.hasPrefix("--"), arg.count > 1 else { return nil }
        var offset = 1
        for ch in arg.dropFirst() {
            offset += String(ch).utf8.count
            if secretLetters.contains(ch) { return (ch, offset) }
            guard ch.isASCII, ch.isLetter else { return nil }
        }
        return nil
    }

    /// Overwrites the C string at `p` with `*` from byte `offset` on (its length stays).
    static func fill(_ p: UnsafeMutablePointer<CChar>, from offset: Int) {
        let n = strlen(p)
        guard offset < n else { return }
        for k in offset..<n { p[k] = CChar(UInt8(ascii: "*")) }
    }

    /// In `scheme://user:password@host...`, overwrites `user:password` with `*`.
    /// With `schemeOptional`, a value without `://` is an authority from its first byte.
    static func hideUserInfo(_ p: UnsafeMutablePointer<CChar>, schemeOptional: Bool = false) {
        let n = strlen(p)
        var k = 0
        // "://"
        while k + 2 < n, !(p[k] == 0x3A && p[k + 1] == 0x2F && p[k + 2] == 0x2F) { k += 1 }
        let start: Int
        if k + 2 < n {
            start = k + 3
        } else if schemeOptional {
            start = 0
        } else {
            return
        }
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
