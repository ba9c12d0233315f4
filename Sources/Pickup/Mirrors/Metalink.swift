import Foundation

#if canImport(FoundationXML)
import FoundationXML
#endif

/// A Metalink 4 document (RFC 5854): the files it describes, each with its size, hashes, piece
/// hashes and the URLs it can be fetched from. Parsed by Foundation's `XMLParser` (libxml2), never
/// by code of our own; what reaches it is bounded first: at most ``maxBytes``, no DOCTYPE (so no
/// entity of any kind, external or internal), at most ``maxDepth`` nested elements, at most
/// ``maxFiles`` files, ``maxURLs`` URLs and ``maxPieces`` piece hashes per file.
public struct Metalink: Sendable, Equatable {
    public struct Hash: Sendable, Equatable {
        public var algorithm: DigestAlgorithm
        public var bytes: [UInt8]
    }

    /// The file cut into pieces of `length` bytes (the last one shorter), each with its hash.
    public struct Pieces: Sendable, Equatable, Codable {
        public var length: Int64
        public var algorithm: DigestAlgorithm
        public var hashes: [[UInt8]]

        public init(length: Int64, algorithm: DigestAlgorithm, hashes: [[UInt8]]) {
            self.length = length
            self.algorithm = algorithm
            self.hashes = hashes
        }

        enum CodingKeys: String, CodingKey { case length, algorithm, hashes }

        // Hashes as hex strings (compact, and checked when read back).
        public func encode(to encoder: any Encoder) throws {
            var c = encoder.container(keyedBy: CodingKeys.self)
            try c.encode(length, forKey: .length)
            try c.encode(algorithm, forKey: .algorithm)
            try c.encode(hashes.map(Hex.encode), forKey: .hashes)
        }

        public init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            length = try c.decode(Int64.self, forKey: .length)
            let algorithm = try c.decode(DigestAlgorithm.self, forKey: .algorithm)
            self.algorithm = algorithm
            let hex = try c.decode([String].self, forKey: .hashes)
            hashes = try hex.map { h in
                guard let b = Hex.decode(h), b.count == algorithm.byteCount else {
                    throw DecodingError.dataCorruptedError(forKey: .hashes, in: c, debugDescription: "not a hash")
                }
                return b
            }
            guard length > 0 else { throw DecodingError.dataCorruptedError(forKey: .length, in: c, debugDescription: "not a length") }
        }
    }

    /// A URL to fetch the file from; a lower `priority` is preferred (RFC 5854 §4.2.16: 1 is the
    /// highest, none is lowest).
    public struct Mirror: Sendable, Equatable {
        public var url: String
        public var priority: Int?
        public var location: String?

        /// A priority as written (`priority="2"`, `pri=2`): 1 to 999,999, else none.
        static func priority(_ text: String?) -> Int? {
            text.flatMap { Int($0) }.flatMap { (1...999_999).contains($0) ? $0 : nil }
        }

        /// By priority (none last), then in the order written.
        static func byPriority(_ mirrors: [Mirror]) -> [Mirror] {
            mirrors.enumerated().sorted { a, b in
                let (pa, pb) = (a.element.priority ?? Int.max, b.element.priority ?? Int.max)
                return pa != pb ? pa < pb : a.offset < b.offset
            }.map(\.element)
        }
    }

    public struct File: Sendable, Equatable {
        /// Sanitized as a server-suggested name is (``SafeFileName/sanitize(_:)``): no directory.
        public var name: String
        public var size: Int64?
        public var hashes: [Hash]
        public var pieces: Pieces?
        /// Sorted by priority (then as written); only http, https, ftp and ftps.
        public var mirrors: [Mirror]
        /// Why some of the file's hashes cannot be checked (malformed piece hashes, or whole-file
        /// hashes of no type Pickup knows and no piece hashes): `get --metalink` refuses such a
        /// document rather than download it as if it had none; a caller that builds requests from
        /// a `File` checks this first. Piece hashes that do not cover ``size`` are kept, and the
        /// download refuses them (``DownloadRequest/length``).
        public var uncheckable: String? = nil

        /// The strongest whole-file hash.
        public var strongestHash: Hash? { hashes.max { $0.algorithm.strength < $1.algorithm.strength } }
    }

    public var files: [File]

    public static let maxBytes = 4 << 20
    public static let maxDepth = 16
    public static let maxFiles = 10_000
    public static let maxURLs = 1_000
    public static let maxPieces = 1 << 20

    /// The namespace of Metalink 4.
    public static let namespace = "urn:ietf:params:xml:ns:metalink"
    /// Its media type (a server may answer a URL with the document).
    public static let mediaType = "application/metalink4+xml"

    /// Parses a document.
    /// - Throws: ``PickupError/invalidInput(_:)`` with a one-line reason (malformed, too large,
    ///   too deep, a DOCTYPE, no usable file).
    public static func parse(_ bytes: [UInt8]) throws(PickupError) -> Metalink {
        guard bytes.count <= maxBytes else {
            throw .invalidInput("the Metalink file is over \(maxBytes >> 20) MiB")
        }
        // A DOCTYPE is where entities are declared (the "billion laughs", external files): a
        // Metalink file has no use for one.
        if contains(bytes, "<!DOCTYPE") || contains(bytes, "<!ENTITY") {
            throw .invalidInput("the Metalink file declares a DOCTYPE or entities, which Metalink does not use")
        }
        // What reaches the parser is valid UTF-8 without control characters (XML 1.0 allows none but
        // tab and line ends), in no other declared encoding: swift-corelibs-foundation's XMLParser,
        // under libxml2's recovery mode, force-unwraps the UTF-8 of names and texts and traps on
        // bytes that are not (found by `MetalinkTests.mutatedDocumentsNeverTrap`).
        guard String.validUTF8(bytes) != nil else {
            throw .invalidInput("the Metalink file is not UTF-8")
        }
        if bytes.contains(where: { $0 < 0x20 && $0 != 0x09 && $0 != 0x0A && $0 != 0x0D || $0 == 0x7F }) {
            throw .invalidInput("the Metalink file has control characters")
        }
        // No processing instruction but the XML declaration at the start: the parser reads an
        // instruction's data through a null pointer when it has none (`<?x?>`, found by the fuzz
        // test), and a Metalink file has no use for one.
        let start = bytes.starts(with: [0xEF, 0xBB, 0xBF]) ? 3 : 0
        var i = 0
        while i + 1 < bytes.count {
            if bytes[i] == UInt8(ascii: "<"), bytes[i + 1] == UInt8(ascii: "?") {
                let isDeclaration = i == start && bytes[(i + 2)...].starts(with: Array("xml".utf8))
                    && bytes.count > i + 5 && [0x20, 0x09, 0x0A, 0x0D].contains(bytes[i + 5])
                guard isDeclaration else { throw .invalidInput("the Metalink file has a processing instruction (<?...?>)") }
            }
            i += 1
        }
        if let declared = declaredEncoding(bytes), !["utf-8", "utf8"].contains(declared.lowercased()) {
            throw .invalidInput("the Metalink file declares the encoding \(declared.prefix(40)); only UTF-8 is read")
        }
        let reader = MetalinkReader()
        let parser = XMLParser(data: Data(bytes))
        // Namespaces are checked here, not by the parser: with namespace processing on, the fuzz
        // test crashed swift-corelibs-foundation's parser (a null pointer read; the input was not
        // isolated), and checking them ourselves keeps that code unused. So the root must be a
        // plain `<metalink xmlns="urn:ietf:params:xml:ns:metalink">`, as generators write it.
        parser.shouldProcessNamespaces = false
        parser.shouldResolveExternalEntities = false
        parser.delegate = reader
        let ok = parser.parse()
        if let failure = reader.failure { throw .invalidInput("the Metalink file \(failure)") }
        guard ok else {
            let line = parser.lineNumber
            throw .invalidInput("the Metalink file is not well-formed XML (line \(line))")
        }
        guard reader.sawRoot else { throw .invalidInput("not a Metalink 4 file (no <metalink> in \(namespace))") }
        let files = reader.files.compactMap { $0.file() }
        guard !files.isEmpty else { throw .invalidInput("the Metalink file names no file with an http, https or ftp URL") }
        var seen = Set<String>()
        for f in files where !seen.insert(f.name).inserted {
            throw .invalidInput("the Metalink file names \(f.name) twice")
        }
        return Metalink(files: files)
    }

    /// The `encoding` of the XML declaration at the start, if it names one.
    static func declaredEncoding(_ bytes: [UInt8]) -> String? {
        let head = String(decoding: bytes.drop { $0 == 0xEF || $0 == 0xBB || $0 == 0xBF }.prefix(200), as: UTF8.self)
        guard head.hasPrefix("<?xml"), let end = head.range(of: "?>") else { return nil }
        let declaration = head[..<end.lowerBound]
        guard let at = declaration.range(of: "encoding") else { return nil }
        let rest = declaration[at.upperBound...].drop { $0 == " " || $0 == "=" || $0 == "\t" }
        guard let quote = rest.first, quote == "\"" || quote == "'" else { return String(rest.prefix(20)) }
        return String(rest.dropFirst().prefix { $0 != quote })
    }

    /// Whether `needle` (ASCII) occurs in `bytes`, ignoring ASCII case.
    static func contains(_ bytes: [UInt8], _ needle: String) -> Bool {
        let n = Array(needle.lowercased().utf8)
        guard bytes.count >= n.count else { return false }
        outer: for i in 0...(bytes.count - n.count) {
            for j in 0..<n.count {
                var b = bytes[i + j]
                if b >= 65 && b <= 90 { b += 32 }
                if b != n[j] { continue outer }
            }
            return true
        }
        return false
    }
}

/// A file as read, before it is checked.
struct MetalinkDraft {
    var name: String?
    var size: Int64?
    var hashes: [Metalink.Hash] = []
    var pieceLength: Int64?
    var pieceAlgorithm: DigestAlgorithm?
    var pieceHashes: [[UInt8]] = []
    var pieceFailed = false
    var sawPieces = false
    /// `<hash>` types of the file that are not known (`sha-384`...), for the message.
    var unknownHashTypes: [String] = []
    var mirrors: [Metalink.Mirror] = []

    /// The file, when it has a usable name and at least one usable URL.
    func file() -> Metalink.File? {
        guard let raw = name, let name = SafeFileName.sanitize(raw), !mirrors.isEmpty else { return nil }
        var pieces: Metalink.Pieces? = nil
        var uncheckable: String? = nil
        if !pieceFailed, let length = pieceLength, let algorithm = pieceAlgorithm, !pieceHashes.isEmpty,
            pieceHashes.allSatisfy({ $0.count == algorithm.byteCount })
        {
            // Kept even when they do not cover the size: the download says so (never a silent drop).
            pieces = Metalink.Pieces(length: length, algorithm: algorithm, hashes: pieceHashes)
        } else if sawPieces {
            uncheckable = "its piece hashes cannot be checked (a length, a known type and well-formed hashes are needed)"
        }
        if hashes.isEmpty, pieces == nil, !unknownHashTypes.isEmpty {
            uncheckable = "its hashes are of types Pickup cannot check (\(unknownHashTypes.prefix(4).joined(separator: ", ")))"
        }
        return Metalink.File(name: name, size: size, hashes: hashes, pieces: pieces, mirrors: Metalink.Mirror.byPriority(mirrors),
                             uncheckable: uncheckable)
    }
}

/// Collects a document's files as `XMLParser` reads it; stops it at the first thing out of bounds.
final class MetalinkReader: NSObject, XMLParserDelegate {
    var files: [MetalinkDraft] = []
    var failure: String?
    var sawRoot = false
    private var path: [String] = []
    private var text = ""
    private var current: MetalinkDraft?
    private var attributes: [String: String] = [:]

    private func stop(_ parser: XMLParser, _ why: String) {
        if failure == nil { failure = why }
        parser.abortParsing()
    }

    func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?,
                attributes attributeDict: [String: String] = [:]) {
        guard failure == nil else { return }
        guard path.count < Metalink.maxDepth else { return stop(parser, "is nested deeper than \(Metalink.maxDepth) elements") }
        // Names with a prefix are of other vocabularies (or a prefixed Metalink, not read).
        let element = name.contains(":") ? "?" : name
        if path.isEmpty {
            guard element == "metalink", attributeDict["xmlns"] == Metalink.namespace else {
                return stop(parser, "is not a Metalink 4 file (its root is not <metalink xmlns=\"\(Metalink.namespace)\">)")
            }
            sawRoot = true
        }
        path.append(element)
        text = ""
        attributes = attributeDict
        switch (path.dropLast().last, element) {
        case ("metalink"?, "file"):
            guard files.count < Metalink.maxFiles else { return stop(parser, "names more than \(Metalink.maxFiles) files") }
            current = MetalinkDraft(name: attributeDict["name"])
        case ("file"?, "pieces"):
            current?.sawPieces = true
            current?.pieceLength = attributeDict["length"].flatMap { Int64($0) }.flatMap { $0 > 0 ? $0 : nil }
            current?.pieceAlgorithm = attributeDict["type"].flatMap(DigestAlgorithm.init(name:))
            if current?.pieceLength == nil || current?.pieceAlgorithm == nil { current?.pieceFailed = true }
        default:
            break
        }
    }

    func parser(_ parser: XMLParser, foundCharacters string: String) {
        guard failure == nil else { return }
        // Only the texts of leaf elements are used, none of them long.
        guard text.utf8.count + string.utf8.count <= 64 * 1024 else { return stop(parser, "has a text over 64 KiB") }
        text += string
    }

    func parser(_ parser: XMLParser, didEndElement name: String, namespaceURI: String?, qualifiedName: String?) {
        guard failure == nil, let element = path.popLast() else { return }
        let value = text.trimmingCharacters(in: .whitespacesAndNewlines)
        text = ""
        switch (path.last, element) {
        case ("metalink"?, "file"):
            if let current { files.append(current) }
            current = nil
        case ("file"?, "size"):
            current?.size = Int64(value).flatMap { $0 >= 0 ? $0 : nil }
        case ("file"?, "hash"):
            if let algorithm = attributes["type"].flatMap(DigestAlgorithm.init(name:)), let bytes = Hex.decode(value),
                bytes.count == algorithm.byteCount
            {
                current?.hashes.append(Metalink.Hash(algorithm: algorithm, bytes: bytes))
            } else if (current?.unknownHashTypes.count ?? 0) < 8 {
                let type = String((attributes["type"] ?? "no type").unicodeScalars.filter { $0.isASCII && $0.value > 0x20 }.prefix(32))
                current?.unknownHashTypes.append(type.isEmpty ? "no type" : type)
            }
        case ("pieces"?, "hash"):
            guard (current?.pieceHashes.count ?? 0) < Metalink.maxPieces else { return stop(parser, "has more than \(Metalink.maxPieces) pieces") }
            if let bytes = Hex.decode(value) { current?.pieceHashes.append(bytes) } else { current?.pieceFailed = true }
        case ("file"?, "url"):
            guard (current?.mirrors.count ?? 0) < Metalink.maxURLs else { return stop(parser, "names more than \(Metalink.maxURLs) URLs for a file") }
            if (try? DownloadURL.check(value)) != nil {
                current?.mirrors.append(Metalink.Mirror(url: value, priority: Metalink.Mirror.priority(attributes["priority"]),
                                                        location: attributes["location"]))
            }
        default:
            break
        }
    }

    func parser(_ parser: XMLParser, parseErrorOccurred parseError: any Error) {}
}
