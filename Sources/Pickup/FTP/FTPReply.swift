/// FTP's control channel as values (RFC 959 §4.2, RFC 2428, RFC 3659): replies, their
/// multi-line form, and the few replies whose text carries data. Pure; every input a server can
/// send is parsed without trapping (fuzzed in the tests).

/// One reply: a three-digit code and its text lines.
public struct FTPReply: Sendable, Equatable {
    public var code: Int
    public var lines: [String]

    /// 1xx preliminary, 2xx done, 3xx more needed, 4xx transient failure, 5xx permanent failure.
    public var kind: Int { code / 100 }
    /// The text of its last line (after the code), for messages: printable ASCII only, at most 200 characters.
    public var text: String {
        let last = lines.last ?? ""
        let rest = last.utf8.count > 4 ? String(last.utf8.dropFirst(4)) ?? "" : ""
        return String(String.UnicodeScalarView(rest.unicodeScalars.filter { $0.value >= 0x20 && $0.value < 0x7F }.prefix(200)))
    }
    /// `550 No such file`, for messages.
    public var summary: String { text.isEmpty ? "\(code)" : "\(code) \(text)" }
}

/// Assembles replies from lines: `123 text` is a whole reply; `123-text` opens one that ends at
/// the first line that starts with `123 ` (RFC 959 §4.2). Bounded: a reply of more than
/// `maxLines` lines is a protocol error.
struct FTPReplyParser {
    static let maxLines = 256
    private var open: (code: Int, lines: [String])?

    enum Failure: Error, Equatable { case malformed(String), tooLong }

    /// Feeds one line (without its CR LF); returns a reply when this line completes one.
    mutating func feed(_ line: String) throws(Failure) -> FTPReply? {
        let bytes = Array(line.utf8)
        if var current = open {
            current.lines.append(line)
            guard current.lines.count <= Self.maxLines else { throw .tooLong }
            if bytes.count >= 4, Self.code(bytes) == current.code, bytes[3] == UInt8(ascii: " ") {
                open = nil
                return FTPReply(code: current.code, lines: current.lines)
            }
            open = current
            return nil
        }
        guard bytes.count >= 3, let code = Self.code(bytes), (100...599).contains(code) else {
            throw .malformed(String(line.prefix(80)))
        }
        if bytes.count == 3 || bytes[3] == UInt8(ascii: " ") { return FTPReply(code: code, lines: [line]) }
        guard bytes[3] == UInt8(ascii: "-") else { throw .malformed(String(line.prefix(80))) }
        open = (code, [line])
        return nil
    }

    static func code(_ b: [UInt8]) -> Int? {
        guard b.count >= 3, b[0...2].allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        return Int(b[0] - 0x30) * 100 + Int(b[1] - 0x30) * 10 + Int(b[2] - 0x30)
    }
}

enum FTPText {
    /// `229 Entering Extended Passive Mode (|||6446|)`: the port (RFC 2428 §3).
    static func epsvPort(_ reply: FTPReply) -> Int? {
        let text = reply.lines.last ?? ""
        guard let open = text.firstIndex(of: "("), let close = text[open...].firstIndex(of: ")") else { return nil }
        let inner = Array(text[text.index(after: open)..<close].utf8)
        // (<d><d><d><port><d>) with the same delimiter four times.
        guard inner.count >= 5, let d = inner.first, inner[1] == d, inner[2] == d, inner.last == d else { return nil }
        let digits = inner[3..<(inner.count - 1)]
        guard !digits.isEmpty, digits.count <= 5, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
            let port = Int(String(decoding: digits, as: UTF8.self)), (1...65535).contains(port)
        else { return nil }
        return port
    }

    /// `227 Entering Passive Mode (h1,h2,h3,h4,p1,p2)`: the port. The address is ignored: the
    /// data connection goes to the control connection's peer (a server cannot send the client
    /// elsewhere: curl's `--ftp-skip-pasv-ip` default).
    static func pasvPort(_ reply: FTPReply) -> Int? {
        let text = Array((reply.lines.last ?? "").utf8)
        // The first run of six comma-separated numbers.
        var i = 0
        while i < text.count {
            guard text[i] >= 0x30 && text[i] <= 0x39 else { i += 1; continue }
            var numbers: [Int] = []
            var j = i, current = 0, digits = 0
            while j < text.count {
                let c = text[j]
                if c >= 0x30 && c <= 0x39 {
                    guard digits < 3 else { break }
                    current = current * 10 + Int(c - 0x30)
                    digits += 1
                } else if c == UInt8(ascii: ","), digits > 0 {
                    numbers.append(current)
                    current = 0
                    digits = 0
                } else {
                    break
                }
                j += 1
            }
            if digits > 0 { numbers.append(current) }
            if numbers.count == 6, numbers.allSatisfy({ $0 <= 255 }) {
                let port = numbers[4] * 256 + numbers[5]
                return (1...65535).contains(port) ? port : nil
            }
            i = j + 1
        }
        return nil
    }

    /// `213 20261124103000` or `213 20261124103000.123`: the time as its 14 digits (and fraction),
    /// for a validator (RFC 3659 §3).
    static func mdtm(_ reply: FTPReply) -> String? {
        let t = reply.text.trimmingSpaces
        let b = Array(t.utf8)
        guard b.count >= 14, b.count <= 24, b[0..<14].allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        if b.count > 14 {
            guard b[14] == UInt8(ascii: "."), b.count > 15, b[15...].allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        }
        return t
    }

    /// `213 1048576` (RFC 3659 §4).
    static func size(_ reply: FTPReply) -> Int64? {
        ContentRange.digits(Substring(reply.text).trimmingSpaces)
    }
}

extension String {
    /// Without leading and trailing spaces (ASCII space only).
    fileprivate var trimmingSpaces: String {
        String(Substring(self).trimmingSpaces)
    }
}
