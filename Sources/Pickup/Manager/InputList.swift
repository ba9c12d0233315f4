/// A list of URLs to download, in the format of `pickup get -i FILE` (close to aria2's input files):
///
/// ```
/// # comments and blank lines are ignored
/// https://example.com/a.iso
/// https://example.com/b.iso out=renamed.iso
/// https://example.com/c.iso
///   out=from-the-next-line.iso
/// ```
///
/// More URLs on a URL's line, separated by tabs (aria2's form), are mirrors of the same file.
/// `out=NAME` names the file in the download directory; it may not leave that directory. Indented
/// lines below a URL hold one option each, the whole line its value (aria2's form): `out=`,
/// `header=Name: value` (repeatable), `checksum=sha-256=HEX`, `user-agent=`, `referer=`.
public struct InputList: Sendable, Equatable {
    /// One URL and its optional file name.
    public struct Entry: Sendable, Equatable {
        public var url: String
        public var name: String?
        /// The line the URL is on (from 1), for messages.
        public var line: Int
        /// Header fields for this URL (`header=`, `user-agent=`, `referer=`).
        public var headers: [RequestHeader] = []
        /// The digest the file must have (`checksum=`).
        public var checksum: ExpectedDigest?
        /// Mirrors of the same file (more URLs on the line).
        public var mirrors: [String] = []
        /// Piece hashes (a Metalink file's).
        public var pieces: Metalink.Pieces?
        /// The file's length (a Metalink file's `size`).
        public var length: Int64?

        public init(url: String, name: String? = nil, line: Int, headers: [RequestHeader] = [], checksum: ExpectedDigest? = nil,
                    mirrors: [String] = [], pieces: Metalink.Pieces? = nil, length: Int64? = nil) {
            self.length = length
            self.mirrors = mirrors
            self.pieces = pieces
            self.url = url
            self.name = name
            self.line = line
            self.headers = headers
            self.checksum = checksum
        }
    }

    /// A list made by other means (a Metalink file's files).
    public init(entries: [Entry]) { self.entries = entries }

    /// A Metalink document's files as list entries: named as it names them (sanitized), from
    /// all their URLs (the first by priority is the primary), verified piece by piece and with
    /// their strongest whole-file hash (`get --metalink`, the daemon's `aria2.addMetalink`).
    public init(metalink m: Metalink) {
        self.init(entries: m.files.enumerated().map { i, f in
            Entry(url: f.mirrors[0].url, name: f.name, line: i + 1,
                  checksum: f.strongestHash.map { ExpectedDigest(source: "the Metalink file", algorithm: $0.algorithm, bytes: $0.bytes) },
                  mirrors: f.mirrors.dropFirst().map(\.url), pieces: f.pieces, length: f.size)
        })
    }

    /// The entries in file order, each URL once (a repeated URL keeps its first line).
    public var entries: [Entry]

    /// Parses the text of an input file.
    /// - Throws: ``PickupError/invalidInput(_:)`` naming the line of the first problem.
    public init(parsing text: String) throws(PickupError) {
        entries = []
        var seen = Set<String>()
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let n = index + 1
            let indented = raw.first == " " || raw.first == "\t"
            let line = raw.trimming(" \t\r")
            if line.isEmpty || line.hasPrefix("#") { continue }
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
            if indented {
                // aria2's option lines belong to the URL above.
                guard !entries.isEmpty else { throw .invalidInput("input line \(n): an option line before any URL") }
                try Self.apply(line, to: &entries[entries.count - 1], line: n)
                continue
            }
            var entry = Entry(url: words[0], name: nil, line: n)
            do { try DownloadURL.check(entry.url) } catch { throw .invalidInput("input line \(n): \(error.description)") }
            for w in words.dropFirst() {
                // A word that is no option is a mirror (aria2 separates them with tabs).
                if !Self.keys.contains(where: { w.hasPrefix($0 + "=") }), w.contains("://") {
                    do { try DownloadURL.check(w) } catch { throw .invalidInput("input line \(n): \(error.description)") }
                    guard entry.mirrors.count < 64 else { throw .invalidInput("input line \(n): more than 64 mirrors") }
                    if w != entry.url, !entry.mirrors.contains(w) { entry.mirrors.append(w) }
                    continue
                }
                try Self.apply(w, to: &entry, line: n)
            }
            if seen.insert(entry.url + "\n" + (entry.name ?? "")).inserted { entries.append(entry) }
        }
    }

    static let keys = ["out", "header", "checksum", "user-agent", "referer"]

    static func apply(_ option: String, to entry: inout Entry, line: Int) throws(PickupError) {
        guard let eq = option.firstIndex(of: "=") else {
            throw .invalidInput("input line \(line): expected KEY=VALUE, not \(option)")
        }
        let value = String(option[option.index(after: eq)...])
        do throws(PickupError) {
            switch option[..<eq] {
            case "out": break
            case "header": entry.headers.append(try RequestHeader(line: value)); return
            case "user-agent": entry.headers.append(try RequestHeader(name: "User-Agent", value: value)); return
            case "referer": entry.headers.append(try RequestHeader(name: "Referer", value: value)); return
            case "checksum":
                guard let digest = ExpectedDigest(checksumArgument: value) else {
                    throw PickupError.invalidInput("checksum=\(value) is not ALGO=HEX")
                }
                entry.checksum = digest
                return
            default:
                throw PickupError.invalidInput("unknown option \(option[..<eq]) (out, header, checksum, user-agent, referer)")
            }
        } catch {
            throw .invalidInput("input line \(line): \(error.description)")
        }
        let name = value
        guard SafeFileName.sanitize(name) == name, !name.contains("/"), name != ".", name != ".." else {
            throw .invalidInput("input line \(line): out=\(name) is not a plain file name")
        }
        entry.name = name
    }
}

extension StringProtocol {
    func trimming(_ set: String) -> String {
        var s = Substring(self)
        while let c = s.first, set.contains(c) { s.removeFirst() }
        while let c = s.last, set.contains(c) { s.removeLast() }
        return String(s)
    }
}
