import CPickupShims
import Crypto
import Foundation
import SystemPackage

/// What a finished download is: kept with the file (an extended attribute) and in the state
/// directory, so that a rerun can recognise its own file and ask the server whether it changed.
public struct CompletionRecord: Codable, Equatable, Sendable {
    /// The URL the user gave.
    public var url: String
    /// The file's name in its directory.
    public var name: String
    /// Validators of the representation the file holds.
    public var validators: Validators?
    /// The file's length.
    public var length: Int64
    /// Modification time (ns since the epoch) when it was finished, to notice a replaced file.
    public var mtime: Int64
    /// A digest verified before the file was put in place, when there was one.
    public var digest: ExpectedDigest?
    /// The directory the file was finished in (so that an index entry whose file is gone can be
    /// dropped: ``CompletionStore/sweep()``).
    public var directory: String?
    /// The mirror whose validators these are, when the URL given gave none (nil: the URL).
    public var source: String? = nil
}

/// Where Pickup keeps state outside the download directory.
public enum StateDirectory {
    /// `$PICKUP_STATE_DIR`, else `$XDG_STATE_HOME/pickup`, else `~/.local/state/pickup`
    /// (`~/Library/Application Support/Pickup` on Apple platforms).
    public static var `default`: FilePath {
        let env = ProcessInfo.processInfo.environment
        if let p = env["PICKUP_STATE_DIR"], !p.isEmpty { return FilePath(p) }
        #if canImport(Darwin)
        return FilePath(NSHomeDirectory()).appending("Library/Application Support/Pickup")
        #else
        if let x = env["XDG_STATE_HOME"], !x.isEmpty { return FilePath(x).appending("pickup") }
        return FilePath(NSHomeDirectory()).appending(".local/state/pickup")
        #endif
    }

    /// Creates a state directory (and its parents) if missing. On Apple platforms it is excluded
    /// from backups (iCloud, Time Machine): it holds the queue and records that a new download
    /// rebuilds, not documents.
    public static func prepare(_ directory: FilePath) throws(PickupError) {
        let existed = FS.isDirectory(directory)
        try FS.makeDirectories(directory)
        // Credentials of queued downloads may be kept in it: the owner's alone.
        if !existed { _ = chmod(directory.string, 0o700) }
        #if canImport(Darwin)
        if !existed {
            var url = URL(fileURLWithPath: directory.string, isDirectory: true)
            var values = URLResourceValues()
            values.isExcludedFromBackup = true
            try? url.setResourceValues(values)
        }
        #else
        _ = existed
        #endif
    }
}

/// Reads and writes completion records.
public struct CompletionStore: Sendable {
    static let attribute = "user.pickup.completed"
    /// The state directory.
    public let stateDirectory: FilePath
    /// Directories the index's keys and records are relative to (``PathBases``).
    public let bases: PathBases

    /// A store in `stateDirectory`.
    public init(stateDirectory: FilePath, bases: PathBases = .none) {
        self.stateDirectory = stateDirectory
        self.bases = bases
    }

    /// The index is 256 append-only files in `completed/` (`index-00.log` ... `index-ff.log`, by
    /// the key's first two hex digits), a line per entry: the entry's key (a hash of the directory
    /// and the URL), a space, and the record's JSON, or `-` once the entry is dropped; the last line
    /// of a key wins. Appending to a file that exists creates no inode (a file per entry made a
    /// batch of small files spend most of its CPU in the file system allocating them), and a lookup
    /// reads 1/256 of the index, scanning it from its end for the one key without decoding the
    /// rest: with 100,000 records (a year of a daily cron job), a lookup reads about 400 lines.
    /// (Until 0.1, 16 files, `index-0.log` ... `index-f.log`, each lookup reading and parsing a
    /// sixteenth: such a file is split into the new ones the first time one of its keys is used.)
    static let bucketCount = 256

    static func key(directory: FilePath, url: String) -> String { key(directory.string, url: url) }

    static func key(_ directory: String, url: String) -> String {
        String(Hex.encode(Array(SHA256.hash(data: Array("\(directory)\n\(url)".utf8)))).prefix(32))
    }

    /// The key of `url` in `directory`: by the directory's path relative to a base when one holds
    /// it (the same after the base moved), else by the path as given (as before there were bases).
    func key(directory: FilePath, url: String) -> String {
        bases.bases.isEmpty ? Self.key(directory: directory, url: url) : Self.key(bases.portable(directory), url: url)
    }

    func bucket(of key: String) -> FilePath {
        migrateLegacyBucket(of: key)
        return stateDirectory.appending("completed").appending("index-\(key.prefix(2)).log")
    }

    /// Splits the 16-way index file `key` fell in before (`index-X.log`) into the 256-way ones,
    /// once: the file is first renamed to a name of this process's (so that one process moves
    /// it), its entries (the last of each key) appended to their new files, then it is removed.
    /// An entry another process appends to it meanwhile may be lost: best effort, as the index is.
    func migrateLegacyBucket(of key: String) {
        let legacy = stateDirectory.appending("completed").appending("index-\(key.prefix(1)).log")
        guard FS.size(legacy) != nil else { return }
        let claimed = FilePath(legacy.string + ".\(UInt32.random(in: 0...UInt32.max)).migrating")
        guard rename(legacy.string, claimed.string) == 0 else { return }
        var byBucket: [String: [UInt8]] = [:]
        for (k, json) in Self.entries(of: claimed) {
            byBucket[String(k.prefix(2)), default: []] += Array((k + " ").utf8) + json + [UInt8(ascii: "\n")]
        }
        for (prefix, lines) in byBucket {
            append(lines, to: stateDirectory.appending("completed").appending("index-\(prefix).log"))
        }
        FS.remove(claimed)
    }

    /// The JSON of `key`'s last line in `data`, scanning from the end (nil when it has none, or
    /// when its last line drops it).
    static func latest(_ key: String, in data: [UInt8]) -> ArraySlice<UInt8>? {
        let wanted = Array(key.utf8)
        guard wanted.count == 32 else { return nil }
        var end = data.endIndex
        while end > data.startIndex {
            let start = data[..<end].lastIndex(of: UInt8(ascii: "\n")).map { $0 + 1 } ?? data.startIndex
            let line = data[start..<end]
            if line.count > 33, line[start + 32] == UInt8(ascii: " "), line.prefix(32).elementsEqual(wanted) {
                let json = line.dropFirst(33)
                return json.elementsEqual([UInt8(ascii: "-")]) ? nil : json
            }
            end = start > data.startIndex ? start - 1 : data.startIndex
        }
        return nil
    }

    /// Appends `line` to the bucket (one `write`, with O_APPEND: lines of concurrent writers do not
    /// interleave). Best effort: an entry lost or torn by a crash reads as no entry, which only
    /// costs a conditional request later.
    func append(_ line: [UInt8], to path: FilePath) {
        func write() throws {
            let fd = try FileDescriptor.open(path, .writeOnly, options: [.create, .append, .closeOnExec], permissions: [.ownerReadWrite])
            _ = try fd.closeAfter { try fd.writeAll(line) }
        }
        do {
            try write()
        } catch {
            // The first entry of this state directory: make its folder.
            try? StateDirectory.prepare(stateDirectory)
            try? FS.makeDirectories(path.removingLastComponent())
            try? write()
        }
    }

    /// The entries of a bucket file, the last one of each key, in file order (a key's `-` drops it).
    static func entries(of path: FilePath) -> [(key: String, json: ArraySlice<UInt8>)] {
        guard let data = FS.readFile(path, limit: 256 << 20) else { return [] }
        var latest: [String: Int] = [:]
        var list: [(key: String, json: ArraySlice<UInt8>)] = []
        for line in data.split(separator: UInt8(ascii: "\n")) {
            guard line.count > 33, line[line.startIndex + 32] == UInt8(ascii: " ") else { continue }
            let key = String(decoding: line.prefix(32), as: UTF8.self)
            let json = line.dropFirst(33)
            if let i = latest[key] { list[i].json = json } else {
                latest[key] = list.count
                list.append((key, json))
            }
        }
        return list.filter { $0.json != [UInt8(ascii: "-")] }
    }

    /// Records the finished file (its encoded record) in the index. Now and then (one finished file
    /// in 32) a bucket is compacted: entries whose file is gone are dropped, so the index stays in
    /// proportion to the files that still exist. On a Dispatch queue, not on Swift's cooperative
    /// pool: it reads a bucket.
    func index(_ data: [UInt8], url: String, directory: FilePath) {
        let key = key(directory: directory, url: url)
        append(Array((key + " ").utf8) + data + [UInt8(ascii: "\n")], to: bucket(of: key))
        if UInt8.random(in: 0..<32) == 0 {
            let store = self, path = bucket(of: key)
            DispatchQueue.global(qos: .utility).async { _ = store.compact(path) }
        }
    }

    /// Compacts every bucket (see ``index(_:url:directory:)``). Returns how many entries remain.
    @discardableResult
    public func sweep() -> Int {
        let digits = Array("0123456789abcdef")
        for d in digits { migrateLegacyBucket(of: String(d)) }
        return digits.flatMap { a in digits.map { b in "\(a)\(b)" } }
            .reduce(0) { $0 + compact(stateDirectory.appending("completed").appending("index-\($1).log")) }
    }

    /// Rewrites a bucket with the entries whose file is still in its directory with its length.
    /// Returns how many remain. (An entry appended by another process while this runs may be lost:
    /// best effort, as above.)
    func compact(_ path: FilePath) -> Int {
        let entries = Self.entries(of: path)
        guard !entries.isEmpty || FS.size(path) != nil else { return 0 }
        var kept: [UInt8] = []
        var count = 0
        for (key, json) in entries {
            guard let rec = try? JSONDecoder().decode(CompletionRecord.self, from: Data(json)),
                let stored = rec.directory
            else { continue }
            // One in a base this process does not name is kept: it cannot be judged here.
            if let directory = bases.resolve(stored), FS.size(directory.appending(rec.name)) != rec.length { continue }
            kept += Array((key + " ").utf8) + json + [UInt8(ascii: "\n")]
            count += 1
        }
        let tmp = FilePath(path.string + ".\(UInt32.random(in: 0...UInt32.max)).tmp")
        guard let fd = try? FileDescriptor.open(tmp, .writeOnly, options: [.create, .exclusiveCreate, .closeOnExec],
                                                permissions: [.ownerReadWrite])
        else { return count }
        let written = (try? fd.closeAfter { try fd.writeAll(kept) }) != nil
        if !written || rename(tmp.string, path.string) != 0 { FS.remove(tmp) }
        return count
    }

    /// The index's latest entry for `key`, if any.
    func indexed(_ key: String) -> CompletionRecord? {
        guard let data = FS.readFile(bucket(of: key), limit: 256 << 20), let json = Self.latest(key, in: data) else { return nil }
        return try? JSONDecoder().decode(CompletionRecord.self, from: Data(json))
    }

    /// Attaches the record to the open file (before its rename), where extended attributes exist;
    /// returns its encoding, for ``index(_:url:directory:)``.
    @discardableResult
    func attach(_ record: CompletionRecord, to file: PartialFile) -> [UInt8] {
        let data = record.json
        _ = data.withUnsafeBytes { pickup_fsetxattr(file.fd.rawValue, Self.attribute, $0.baseAddress, $0.count) }
        return data
    }

    /// The record stored on an open file, if any.
    func attached(to fd: FileDescriptor) -> CompletionRecord? {
        var buf = [UInt8](repeating: 0, count: 16384)
        let n = buf.withUnsafeMutableBytes { pickup_fgetxattr(fd.rawValue, Self.attribute, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        return try? JSONDecoder().decode(CompletionRecord.self, from: Data(buf[0..<n]))
    }

    /// The finished download of `url` in `directory` (with `name` when the caller fixed the name),
    /// if the file there is still the one Pickup finished: same URL and length, and either its own
    /// attribute says so or its modification time is unchanged. An index entry whose file is gone
    /// or replaced is deleted.
    ///
    /// The newest version is the one found: when the file had changed on the server, its new
    /// version was saved beside the old one as `name (n).ext`, and that is what a rerun checks
    /// against (else every rerun would save the same new version once more).
    ///
    /// `versions: false` (the caller overwrites `name`): only `name` itself counts.
    func lookup(url: String, in directory: DirectoryHandle, name: String?, versions: Bool = true) -> (FilePath, CompletionRecord)? {
        var candidates: [(String, CompletionRecord?)] = []
        // (Records indexed before the bases were given are found by their old key.)
        let key = key(directory: directory.path, url: url)
        let indexed = self.indexed(key) ?? (bases.bases.isEmpty ? nil : self.indexed(Self.key(directory: directory.path, url: url)))
        let ofName = { (candidate: String) in
            name == nil || candidate == name || (versions && SafeFileName.isNumbered(candidate, of: name!))
        }
        if let rec = indexed, ofName(rec.name) { candidates.append((rec.name, rec)) }
        if let name, versions {
            // Without the index (another state directory), the numbered versions, newest first.
            var numbered: [String] = []
            for n in 1...Self.maxVersions {
                let candidate = SafeFileName.numbered(name, n)
                guard directory.exists(candidate) else { break }
                numbered.append(candidate)
            }
            for candidate in numbered.reversed() where !candidates.contains(where: { $0.0 == candidate }) {
                candidates.append((candidate, nil))
            }
        }
        if let name, !candidates.contains(where: { $0.0 == name }) { candidates.append((name, nil)) }
        for (name, indexed) in candidates {
            guard let fd = try? directory.openFile(name, write: false) else { continue }
            defer { try? fd.close() }
            guard let size = try? fd.seek(offset: 0, from: .end) else { continue }
            if let rec = attached(to: fd), rec.url == url, rec.length == size { return (directory.pathOf(name), rec) }
            if let rec = indexed, rec.length == size, rec.mtime == FS.mtime(fd) { return (directory.pathOf(name), rec) }
        }
        // The indexed file is gone or is another file now: the entry is of no more use.
        if let indexed, ofName(indexed.name) { append(Array((key + " -\n").utf8), to: bucket(of: key)) }
        return nil
    }

    /// How many numbered versions of a name ``lookup(url:in:name:)`` looks at.
    static let maxVersions = 1000
}
