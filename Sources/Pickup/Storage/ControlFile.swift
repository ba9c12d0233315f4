import Crypto
import Foundation
import SystemPackage

/// One byte range of the file and how much of it is durably on disk.
public struct SegmentRecord: Codable, Equatable, Sendable {
    /// First byte of the range.
    public var start: Int64
    /// One past the last byte of the range; nil while the complete length is unknown.
    public var end: Int64?
    /// Bytes from `start` on that are written and fsynced.
    public var done: Int64

    /// A segment.
    public init(start: Int64, end: Int64?, done: Int64) {
        self.start = start
        self.end = end
        self.done = done
    }
}

/// What the control file records about an unfinished download.
public struct ControlRecord: Codable, Equatable, Sendable {
    /// The URL the user gave (redirects are followed again on every run).
    public var url: String
    /// The final path the file will be renamed to, once chosen.
    public var target: String?
    /// Validators of the representation whose bytes are held.
    public var validators: Validators?
    /// The complete length, when known.
    public var totalLength: Int64?
    /// The byte ranges and their durable progress.
    public var segments: [SegmentRecord]
    /// A digest the server announced for the whole representation.
    public var serverDigest: ExpectedDigest?
    /// Names the bytes' representation for the ``CursorFile`` beside the partial file: new
    /// whenever the held bytes are discarded, so that slots written for other bytes never count.
    public var epoch: UInt64?
    /// The file's mirrors (sources 1, 2, ... after `url`), each with its own validators; nil for one URL.
    public var mirrors: [SourceRecord]?
    /// With mirrors: which source wrote which bytes (`[start, end, source]`, merged), so that a
    /// bad piece or a failed hash is blamed on its source after a kill too.
    public var writers: [[Int64]]?
    /// The URL itself (not a redirect's target) has answered a range request with a 206
    /// (Content-Range) for these bytes: a range asked of it later is expected to be served as
    /// one, not as the whole file. Nil after a restart from zero, and in records written before
    /// it was kept.
    public var rangesServed: Bool?

    /// A record.
    public init(
        url: String, target: String?, validators: Validators?, totalLength: Int64?, segments: [SegmentRecord],
        serverDigest: ExpectedDigest? = nil, epoch: UInt64? = nil, mirrors: [SourceRecord]? = nil
    ) {
        self.mirrors = mirrors
        self.url = url
        self.target = target
        self.validators = validators
        self.totalLength = totalLength
        self.segments = segments
        self.serverDigest = serverDigest
        self.epoch = epoch
    }

    /// A new ``epoch`` (exact in JSON: below 2^53).
    static func newEpoch() -> UInt64 { UInt64.random(in: 1..<(1 << 53)) }

    /// A record of nothing held yet, with a new epoch.
    static func empty(url: String) -> ControlRecord {
        ControlRecord(url: url, target: nil, validators: nil, totalLength: nil,
                      segments: [SegmentRecord(start: 0, end: nil, done: 0)], epoch: ControlRecord.newEpoch())
    }

    /// The validators of source `i` (0: `url`, else a mirror): each server's own.
    public func validators(of i: Int) -> Validators? {
        i == 0 ? validators : mirrors.flatMap { $0.indices.contains(i - 1) ? $0[i - 1].validators : nil }
    }

    /// Sets the validators of source `i`.
    mutating func setValidators(_ v: Validators?, of i: Int) {
        if i == 0 {
            validators = v
        } else if mirrors?.indices.contains(i - 1) == true {
            mirrors![i - 1].validators = v
        }
    }

    /// Bytes durably held in all segments.
    public var durableBytes: Int64 { segments.reduce(0) { $0 + $1.done } }
}

/// The control file beside a partial file: written atomically (temp file, fsync, rename, fsync
/// of the directory) and self-checking, so that a torn or foreign file is treated as absent.
///
/// Layout: a line `pickup-control 1 <payload length> <sha-256 of payload, hex>`, then the JSON
/// payload, then spaces up to a whole number of 4 KiB blocks. Any mismatch of magic, version,
/// length or checksum makes ``load(_:)`` return nil.
///
/// The padding is what lets a checkpoint succeed on a full disk: when the atomic replace cannot
/// create its temp file (ENOSPC), the record is rewritten in place inside blocks the file already
/// has. A write torn there is caught by the checksum, never trusted.
public enum ControlFile {
    static let magic = "pickup-control"
    static let version = 1

    /// Encodes a record with its header.
    public static func encode(_ record: ControlRecord) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let payload = Array((try? encoder.encode(record)) ?? Data())
        let digest = Hex.encode(Array(SHA256.hash(data: payload)))
        var bytes = Array("\(magic) \(version) \(payload.count) \(digest)\n".utf8) + payload
        let padded = (bytes.count + 4095) / 4096 * 4096
        bytes += [UInt8](repeating: UInt8(ascii: " "), count: padded - bytes.count)
        return bytes
    }

    /// Decodes bytes written by ``encode(_:)``; nil when torn, foreign or of another version.
    public static func decode(_ bytes: [UInt8]) -> ControlRecord? {
        guard let nl = bytes.firstIndex(of: UInt8(ascii: "\n")), nl < 200 else { return nil }
        let header = String(decoding: bytes[..<nl], as: UTF8.self).split(separator: " ")
        guard header.count == 4, header[0] == magic, header[1] == "\(version)", let length = Int(header[2])
        else { return nil }
        guard bytes.count >= nl + 1 + length else { return nil }
        let payload = Array(bytes[(nl + 1)..<(nl + 1 + length)])
        guard bytes[(nl + 1 + length)...].allSatisfy({ $0 == UInt8(ascii: " ") }),
            Hex.encode(Array(SHA256.hash(data: payload))) == header[3]
        else { return nil }
        return try? JSONDecoder().decode(ControlRecord.self, from: Data(payload))
    }

    /// Reads the control file at `path`; nil when missing, untrustworthy or a symlink.
    public static func load(_ path: FilePath) -> ControlRecord? {
        guard let name = path.lastComponent?.string,
            let dir = try? DirectoryHandle.open(path.removingLastComponent().isEmpty ? "." : path.removingLastComponent(), create: false)
        else { return nil }
        return load(name, in: dir)
    }

    /// Reads the control file `name` in `directory`; nil when missing or untrustworthy.
    static func load(_ name: String, in directory: DirectoryHandle) -> ControlRecord? {
        guard let data = directory.readFile(name, limit: 64 << 20) else { return nil }
        return decode(data)
    }

    /// Replaces the control file atomically; `durable`: and durably (fsync of the file and the
    /// directory). A record that claims no bytes needs no fsync.
    /// `barrier`: its fsyncs order rather than flush (a periodic checkpoint on Apple platforms).
    static func store(_ record: ControlRecord, as name: String, in directory: DirectoryHandle,
                      durable: Bool = true, barrier: Bool = false) throws(PickupError) {
        let bytes = encode(record)
        do {
            try replace(bytes, as: name, in: directory, durable: durable, barrier: barrier)
        } catch {
            guard case .fileSystem(_, .noSpace) = error else { throw error }
            try overwriteInPlace(bytes, as: name, in: directory, original: error)
        }
    }

    /// A new temp file (never through a symlink: any entry at its name is removed first and the
    /// file is created exclusively), fsync, rename over the control file, fsync of the directory
    /// (without the fsyncs unless `durable`).
    static func replace(_ bytes: [UInt8], as name: String, in directory: DirectoryHandle, durable: Bool = true,
                        barrier: Bool = false) throws(PickupError) {
        do { try TestFaults.check(.store) } catch { throw .fileSystem(directory.pathOf(name).string, error) }
        try directory.replaceFile(name, with: bytes, durable: durable, barrier: barrier, excludedFromBackup: true)
    }

    /// The disk is full: rewrite the existing file within its own blocks, if it is large enough.
    static func overwriteInPlace(_ bytes: [UInt8], as name: String, in directory: DirectoryHandle,
                                 original: PickupError) throws(PickupError) {
        directory.remove(name + ".tmp")
        guard let size = directory.size(name), size >= Int64(bytes.count) else { throw original }
        do {
            let fd = try directory.openFile(name, write: true)
            defer { try? fd.close() }
            _ = try fd.writeAll(toAbsoluteOffset: 0, bytes)
            try FS.fsync(fd)
        } catch {
            throw original
        }
    }

    /// Removes the control file (and a stray temp file).
    static func remove(_ name: String, in directory: DirectoryHandle) {
        directory.remove(name)
        directory.remove(name + ".tmp")
    }
}
