import Foundation
import RawStructuredFieldValues

/// A digest algorithm Pickup can verify a finished file with.
public enum DigestAlgorithm: String, Sendable, Codable, CaseIterable {
    case sha256 = "sha-256"
    case sha512 = "sha-512"
    case sha1 = "sha-1"
    case md5 = "md5"

    /// Accepts the IANA names (`sha-256`) and the common spellings without a dash (`sha256`).
    public init?(name: String) {
        let n = name.lowercased().replacingOccurrences(of: "_", with: "-")
        switch n {
        case "sha-256", "sha256": self = .sha256
        case "sha-512", "sha512": self = .sha512
        case "sha-1", "sha1", "sha": self = .sha1
        case "md5": self = .md5
        default: return nil
        }
    }

    /// Length of the digest in bytes.
    public var byteCount: Int {
        switch self {
        case .sha256: 32
        case .sha512: 64
        case .sha1: 20
        case .md5: 16
        }
    }

    /// Preference when a server offers several: the strongest first.
    var strength: Int {
        switch self {
        case .sha512: 4
        case .sha256: 3
        case .sha1: 2
        case .md5: 1
        }
    }
}

/// An expected digest of the whole file: where it came from, the algorithm and the bytes.
public struct ExpectedDigest: Equatable, Sendable, Codable {
    /// Where the expectation came from, for messages (`--checksum`, `Repr-Digest`, `Digest`).
    public var source: String
    /// The algorithm.
    public var algorithm: DigestAlgorithm
    /// The digest bytes.
    public var bytes: [UInt8]

    /// An expected digest.
    public init(source: String, algorithm: DigestAlgorithm, bytes: [UInt8]) {
        self.source = source
        self.algorithm = algorithm
        self.bytes = bytes
    }

    /// Parses the user's `ALGO=HEX` (e.g. `sha-256=9f86d0…`); nil when malformed.
    public init?(checksumArgument arg: String) {
        guard let eq = arg.firstIndex(of: "="), let algo = DigestAlgorithm(name: String(arg[..<eq])) else {
            return nil
        }
        let hex = arg[arg.index(after: eq)...].lowercased()
        guard hex.count == algo.byteCount * 2, let bytes = Hex.decode(hex) else { return nil }
        self.init(source: "--checksum", algorithm: algo, bytes: bytes)
    }

    /// Lower-case hex of the digest bytes.
    public var hex: String { Hex.encode(bytes) }
}

/// Digest fields that describe the whole representation, whatever range a response carries:
/// `Repr-Digest` (RFC 9530, a structured dictionary of byte sequences) and the older
/// `Digest` (RFC 3230). `Content-Digest` covers only the bytes of one message, so it is not used.
public enum DigestHeader {
    /// The strongest digest offered by `Repr-Digest`, else by `Digest`.
    public static func expected(reprDigest: String?, digest: String?) -> ExpectedDigest? {
        if let r = reprDigest, let d = strongest(parseReprDigest(r), source: "Repr-Digest") { return d }
        if let d = digest, let e = strongest(parseLegacyDigest(d), source: "Digest") { return e }
        return nil
    }

    static func strongest(_ items: [(DigestAlgorithm, [UInt8])], source: String) -> ExpectedDigest? {
        items.max(by: { $0.0.strength < $1.0.strength }).map {
            ExpectedDigest(source: source, algorithm: $0.0, bytes: $0.1)
        }
    }

    /// `sha-256=:BASE64:, sha-512=:BASE64:`: a structured dictionary (RFC 9651, parsed by
    /// swift-http-structured-headers) whose members are byte sequences. A field that does not
    /// parse is ignored whole (RFC 9651 section 4.2); members of unknown algorithms, of another
    /// type or of the wrong length are skipped.
    static func parseReprDigest(_ value: String) -> [(DigestAlgorithm, [UInt8])] {
        var parser = StructuredFieldValueParser(Array(value.utf8))
        guard let members = try? parser.parseDictionaryFieldValue() else { return [] }
        return members.compactMap { key, member in
            guard case .item(let item) = member, case .undecodedByteSequence(let base64) = item.rfc9651BareItem,
                let algorithm = DigestAlgorithm(name: key), let bytes = Data(base64Encoded: base64),
                bytes.count == algorithm.byteCount
            else { return nil }
            return (algorithm, Array(bytes))
        }
    }

    /// `SHA-256=BASE64, MD5=BASE64` (RFC 3230).
    static func parseLegacyDigest(_ value: String) -> [(DigestAlgorithm, [UInt8])] {
        value.split(separator: ",").compactMap { member in
            let m = member.trimmingSpaces
            guard let eq = m.firstIndex(of: "="), let algo = DigestAlgorithm(name: String(m[..<eq])),
                let data = Data(base64Encoded: String(m[m.index(after: eq)...])), data.count == algo.byteCount
            else { return nil }
            return (algo, Array(data))
        }
    }
}
