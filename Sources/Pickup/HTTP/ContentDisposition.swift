/// The file name a server suggests in `Content-Disposition` (RFC 6266), including the
/// `filename*` extended form of RFC 8187, which takes precedence over plain `filename`.
///
/// The result is untrusted: pass it through ``SafeFileName`` before touching the file system.
public enum ContentDisposition {
    /// The suggested file name, decoded but not yet sanitized; nil when there is none.
    public static func filename(_ header: String) -> String? {
        let params = parameters(header)
        if let ext = params.first(where: { $0.name == "filename*" }), let decoded = decodeExtValue(ext.value) {
            return decoded
        }
        return params.first(where: { $0.name == "filename" })?.value
    }

    /// `type; name=value; name="quoted"` split into lower-cased names and unquoted values.
    static func parameters(_ header: String) -> [(name: String, value: String)] {
        var result: [(String, String)] = []
        let chars = Array(header.unicodeScalars)
        var i = 0
        // Skip the disposition type.
        while i < chars.count, chars[i] != ";" { i += 1 }
        while i < chars.count {
            i += 1  // past ';'
            while i < chars.count, chars[i] == " " || chars[i] == "\t" { i += 1 }
            var name = ""
            while i < chars.count, chars[i] != "=", chars[i] != ";" {
                name.unicodeScalars.append(chars[i])
                i += 1
            }
            guard i < chars.count, chars[i] == "=" else { continue }
            i += 1
            while i < chars.count, chars[i] == " " || chars[i] == "\t" { i += 1 }
            var value = ""
            if i < chars.count, chars[i] == "\"" {
                i += 1
                while i < chars.count, chars[i] != "\"" {
                    if chars[i] == "\\", i + 1 < chars.count { i += 1 }
                    value.unicodeScalars.append(chars[i])
                    i += 1
                }
                while i < chars.count, chars[i] != ";" { i += 1 }
            } else {
                while i < chars.count, chars[i] != ";" {
                    value.unicodeScalars.append(chars[i])
                    i += 1
                }
                value = String(Substring(value).trimmingSpaces)
            }
            result.append((String(Substring(name).trimmingSpaces).lowercased(), value))
        }
        return result
    }

    /// RFC 8187 `charset'language'pct-encoded`, for UTF-8 and ISO-8859-1.
    static func decodeExtValue(_ value: String) -> String? {
        let parts = value.split(separator: "'", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, let bytes = PercentDecoding.bytes(parts[2]) else { return nil }
        switch parts[0].lowercased() {
        case "utf-8":
            return String.validUTF8(bytes)
        case "iso-8859-1":
            return String(String.UnicodeScalarView(bytes.map { Unicode.Scalar($0) }))
        default:
            return nil
        }
    }
}

enum PercentDecoding {
    /// Decodes `%XX` escapes to bytes; nil on a malformed escape.
    static func bytes<S: StringProtocol>(_ s: S) -> [UInt8]? {
        var out: [UInt8] = []
        let utf8 = Array(s.utf8)
        var i = 0
        while i < utf8.count {
            if utf8[i] == UInt8(ascii: "%") {
                guard i + 2 < utf8.count, let h = hex(utf8[i + 1]), let l = hex(utf8[i + 2]) else { return nil }
                out.append(h << 4 | l)
                i += 3
            } else {
                out.append(utf8[i])
                i += 1
            }
        }
        return out
    }

    static func hex(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

/// Turns an untrusted name (from a server or a URL) into one safe to create inside a directory.
///
/// No path separators, no `.` or `..`, no control characters, no leading dots (hidden files), never
/// a helper file's name, and short enough that its helper files' names fit a file system's 255
/// bytes, keeping the extension when it has to shorten the name.
public enum SafeFileName {
    /// The partial file of `NAME` is `NAME.pickup-part`.
    public static let partialSuffix = ".pickup-part"
    /// Its control file is `NAME.pickup-ctl` (replaced through `NAME.pickup-ctl.tmp`).
    public static let controlSuffix = ".pickup-ctl"
    /// The suffix of the mapped cursors beside a partial file (see the engine's `CursorFile`).
    public static let cursorSuffix = ".pickup-pos"
    /// The longest file name, in UTF-8 bytes: 255 less the longest helper suffix (`.pickup-ctl.tmp`).
    public static let maxBytes = 255 - controlSuffix.utf8.count - 4

    /// Whether `name` is the name of one of Pickup's helper files.
    public static func isHelperName(_ name: String) -> Bool {
        name.hasSuffix(partialSuffix) || name.hasSuffix(controlSuffix) || name.hasSuffix(controlSuffix + ".tmp")
            || name.hasSuffix(cursorSuffix)
    }

    /// Checks a name the user gave for the finished file (`-o`, `out=`, the daemon's `name`).
    /// - Throws: ``PickupError/invalidInput(_:)`` saying why it cannot be used.
    public static func checkOutputName(_ name: String) throws(PickupError) {
        if name.utf8.count > maxBytes {
            throw .invalidInput("the file name is \(name.utf8.count) bytes long; at most \(maxBytes) fit beside its helper files")
        }
        if isHelperName(name) {
            throw .invalidInput("'\(name)' ends like one of pickup's helper files (\(partialSuffix), \(controlSuffix), \(cursorSuffix)); choose another name")
        }
    }

    /// The sanitized name, or nil if nothing usable remains.
    public static func sanitize(_ raw: String) -> String? {
        var scalars = String.UnicodeScalarView()
        for s in raw.unicodeScalars {
            switch s.value {
            case 0..<0x20, 0x7F, 0x80..<0xA0: continue  // control characters
            case 0x2F, 0x5C, 0x3A, 0x2A, 0x3F, 0x22, 0x3C, 0x3E, 0x7C:  // / \ : * ? " < > |
                scalars.append("_")
            case 0x202A...0x202E, 0x2066...0x2069, 0x200E, 0x200F:  // bidi overrides hide extensions
                continue
            default:
                scalars.append(s)
            }
        }
        var name = Substring(String(scalars))
        while let f = name.first, f == "." || f == " " { name = name.dropFirst() }
        while let l = name.last, l == "." || l == " " { name = name.dropLast() }
        guard !name.isEmpty else { return nil }
        // Shortened first, then checked: a shortened name can end like a helper file's.
        var short = truncate(String(name), maxBytes: maxBytes - 8)
        if isHelperName(short) { short.append("_") }
        return short
    }

    static func truncate(_ name: String, maxBytes: Int) -> String {
        guard name.utf8.count > maxBytes else { return name }
        let (stem, ext) = split(name)
        let keepExt = ext.utf8.count <= 32 ? ext : ""
        var out = ""
        for ch in stem {
            if out.utf8.count + String(ch).utf8.count + keepExt.utf8.count > maxBytes { break }
            out.append(ch)
        }
        // A cut can leave a name ending like a helper file's: its last character is replaced.
        let cut = out + keepExt
        return isHelperName(cut) ? String(cut.dropLast()) + "_" : cut
    }

    /// Splits `name.ext` into `name` and `.ext` (the extension may be empty).
    public static func split(_ name: String) -> (stem: String, ext: String) {
        if let dot = name.lastIndex(of: "."), dot != name.startIndex {
            return (String(name[..<dot]), String(name[dot...]))
        }
        return (name, "")
    }

    /// `name (n).ext`: the n-th alternative when `name.ext` is taken.
    public static func numbered(_ name: String, _ n: Int) -> String {
        let (stem, ext) = split(name)
        return truncate("\(stem) (\(n))\(ext)", maxBytes: maxBytes)
    }

    /// Whether `candidate` is `numbered(name, n)` for some n >= 1.
    public static func isNumbered(_ candidate: String, of name: String) -> Bool {
        guard let open = candidate.lastIndex(of: "("), let close = candidate[open...].firstIndex(of: ")") else { return false }
        let digits = candidate[candidate.index(after: open)..<close]
        guard !digits.isEmpty, digits.count <= 9, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let n = Int(digits), n >= 1
        else { return false }
        return numbered(name, n) == candidate
    }

    /// The path of an absolute URL as written (still percent-encoded): what follows the authority,
    /// up to a query or fragment; nil when `url` has no `scheme://`.
    public static func rawPath(ofURL url: String) -> Substring? {
        let u = url.utf8
        // "://" by bytes (String.range(of:) goes through Foundation and costs more than the rest).
        var i = u.startIndex
        var authority: String.Index? = nil
        while i < u.endIndex {
            if u[i] == UInt8(ascii: ":") {
                let a = u.index(after: i)
                if a < u.endIndex, u[a] == UInt8(ascii: "/") {
                    let b = u.index(after: a)
                    if b < u.endIndex, u[b] == UInt8(ascii: "/") {
                        authority = u.index(after: b)
                        break
                    }
                }
            }
            i = u.index(after: i)
        }
        guard var j = authority else { return nil }
        var slash: String.Index? = nil
        while j < u.endIndex, u[j] != UInt8(ascii: "?"), u[j] != UInt8(ascii: "#") {
            if slash == nil, u[j] == UInt8(ascii: "/") { slash = j }
            j = u.index(after: j)
        }
        guard let slash else { return "" }
        return url[slash..<j]
    }

    /// The last path segment of a URL path, percent-decoded; nil for an empty segment.
    public static func fromURLPath(_ path: String) -> String? {
        let u = path.utf8
        let end = u.firstIndex(of: UInt8(ascii: "?")) ?? u.endIndex
        var start = u.startIndex
        var i = start
        while i < end {
            if u[i] == UInt8(ascii: "/") { start = u.index(after: i) }
            i = u.index(after: i)
        }
        // A trailing slash: the last segment that has something in it.
        if start == end {
            guard let last = path[..<end].split(separator: "/").last else { return nil }
            return decodedSegment(last)
        }
        return decodedSegment(path[start..<end])
    }

    static func decodedSegment(_ segment: Substring) -> String? {
        guard let bytes = PercentDecoding.bytes(segment), let decoded = String.validUTF8(bytes)
        else { return nil }
        return decoded.isEmpty ? nil : decoded
    }
}

extension String {
    /// `bytes` as a string when they are valid UTF-8, else nil: `String(validating:as:)` without
    /// its macOS 15 / iOS 18 floor (the package supports macOS 14 and iOS 16). Invalid sequences
    /// decode as U+FFFD, so the text's UTF-8 differs from `bytes` exactly when they are invalid.
    static func validUTF8<C: Collection>(_ bytes: C) -> String? where C.Element == UInt8 {
        let text = String(decoding: bytes, as: UTF8.self)
        return text.utf8.elementsEqual(bytes) ? text : nil
    }
}
